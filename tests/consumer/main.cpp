#include <cstdio>

#include <m3sa/m3sa.h>

int main() {
  m3sa::OpPlan plan;
  m3sa::PlanRequest request;
  request.capacities = {8, 64, 256};
  const m3sa::Status status = m3sa::make_plan(request, &plan);
  std::printf("m3sa %s consumer: plan %s, workspace %zu bytes\n", m3sa::version_string(),
              status.to_string().c_str(), plan.workspace_bytes);
  return status.ok() ? 0 : 1;
}
