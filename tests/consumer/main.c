/* A C11 consumer of the installed shared library libm3sa_c (m3sa/c_api.h). */
#include <stdio.h>

#include <m3sa/c_api.h>

int main(void) {
  m3sa_plan_request request;
  m3sa_plan_request_init(&request);
  request.capacities.max_requests = 8;
  request.capacities.max_tokens = 64;
  request.capacities.max_blocks_per_request = 256;
  m3sa_plan plan;
  const m3sa_status status = m3sa_make_plan(&request, &plan);
  printf("m3sa %s C consumer: plan %s (%s), workspace %llu bytes\n", m3sa_version_string(),
         m3sa_status_name(status), m3sa_plan_implementation_name(&plan),
         (unsigned long long)plan.workspace_bytes);
  return status == M3SA_OK ? 0 : 1;
}
