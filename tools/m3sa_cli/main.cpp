// The m3sa command-line tool. Results go to stdout, progress and errors to stderr.
// Exit codes: 0 OK, 1 a check failed, 2 usage error.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "bench.h"
#include "cpu/simd.h"
#include "demo.h"
#include "m3sa/m3sa.h"

namespace {

int print_info() {
  std::printf("m3sa %s (commit %s)\n", m3sa::version_string(), m3sa::build_commit());
  std::printf("CUDA backend built: %s; CUDA devices visible: %d\n",
              m3sa::cuda_backend_built() ? "yes" : "no", m3sa::cuda_device_count());
  std::printf("CPU row kernels: %s (detected %s; M3SA_CPU_MAX_ISA caps them)\n",
              m3sa::cpu::to_string(m3sa::cpu::simd_level()),
              m3sa::cpu::to_string(m3sa::cpu::detected_simd_level()));
  const m3sa::MsaConfig config;
  for (m3sa::Backend b : {m3sa::Backend::reference, m3sa::Backend::cpu, m3sa::Backend::cuda}) {
    const m3sa::Status s = m3sa::supports(b, config);
    std::printf("  %-9s : %s\n", m3sa::to_string(b), s.ok() ? "supported" : s.message().c_str());
  }
  // Every registered implementation, and whether it runs the default config here.
  std::printf("implementations (default config, bf16 caches):\n");
  for (int i = 0; i < m3sa::implementation_count(); ++i) {
    const m3sa::ImplementationInfo info = m3sa::implementation_info(i);
    m3sa::PlanRequest request;
    request.op = info.op;
    request.config = config;
    const m3sa::Status s = m3sa::implementation_supports(i, request);
    std::printf("  %-30s %-9s %-18s %s\n      %s\n", info.name, m3sa::to_string(info.backend),
                m3sa::to_string(info.op), s.ok() ? "runs here" : s.message().c_str(),
                info.description);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"m3sa: MiniMax-M3 sparse attention (MSA) kernels for inference engines"};
  app.require_subcommand(1);

  m3sa::cli::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "Run one MSA layer end to end on a synthetic mixed batch and verify it");
  demo_cmd->add_option("--backend", demo.backend, "auto, cuda, cpu or reference")
      ->check(CLI::IsMember({"auto", "cuda", "cpu", "reference"}));
  demo_cmd->add_option("--index-dtype", demo.index_dtype, "index-K cache (and index-Q) dtype")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  demo_cmd->add_option("--kv-dtype", demo.kv_dtype, "main KV cache dtype")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  demo_cmd->add_option("--decode-requests", demo.decode_requests, "decode requests")
      ->check(CLI::Range(0, 4096));
  demo_cmd->add_option("--decode-context", demo.decode_context, "tokens cached per decode request")
      ->check(CLI::Range(1, 1 << 20));
  demo_cmd->add_option("--mtp", demo.mtp, "query tokens per decode request (MTP)")
      ->check(CLI::Range(1, 16));
  demo_cmd
      ->add_option("--prefill-chunk", demo.prefill_chunk,
                   "prefill chunk tokens (0: no prefill request)")
      ->check(CLI::Range(0, 1 << 16));
  demo_cmd->add_option("--prefill-prefix", demo.prefill_prefix, "tokens cached before the chunk")
      ->check(CLI::Range(0, 1 << 20));
  demo_cmd->add_option("--index-heads", demo.index_heads, "index-Q heads (== KV heads)")
      ->check(CLI::Range(1, 16));
  demo_cmd->add_option("--q-heads", demo.q_heads, "query heads")->check(CLI::Range(1, 256));
  demo_cmd->add_option("--kv-heads", demo.kv_heads, "KV heads")->check(CLI::Range(1, 16));
  demo_cmd->add_option("--top-k", demo.top_k, "selected blocks per token and head")
      ->check(CLI::Range(1, 32));
  demo_cmd->add_option("--threads", demo.threads, "CPU threads (0: OpenMP default)")
      ->check(CLI::Range(0, 1024));
  demo_cmd
      ->add_option("--sample-rows", demo.sample_rows,
                   "prefill tokens verified against the reference")
      ->check(CLI::Range(0, 1 << 16));
  demo_cmd->add_flag("--reference-full", demo.reference_full,
                     "also time the reference on the whole batch (slow)");
  demo_cmd->add_option("--seed", demo.seed, "data seed");

  m3sa::cli::BenchOptions bench;
  CLI::App* bench_cmd =
      app.add_subcommand("bench", "Time the ops against ceilings measured in the same run (the "
                                  "CUDA backend, or --backend cpu)");
  bench_cmd->add_option("--set", bench.set, "full or quick")
      ->check(CLI::IsMember({"full", "quick"}));
  bench_cmd->add_option("--json", bench.json_path,
                        "also write the records as JSON to this file (rewritten after every case)");
  bench_cmd->add_option("--filter", bench.filter,
                        "only cases whose name contains this text (\"^text\": starts with it)");
  bench_cmd
      ->add_option_function<std::string>(
          "--index-pages",
          [&bench](const std::string& order) { bench.index_pages_in_order = order == "in-order"; },
          "index-cache pages of the indexer and context-parallel cases: shuffled (default, as "
          "the peer's) or in-order")
      ->check(CLI::IsMember({"shuffled", "in-order"}));
  bench_cmd
      ->add_option("--plan-requests", bench.plan_requests,
                   "size the indexer cases' plans for this many requests (as an engine that plans "
                   "once for its largest batch; default: each case's batch)")
      ->check(CLI::NonNegativeNumber);
  bench_cmd
      ->add_option("--backend", bench.backend,
                   "cuda (the GPU cases, against vLLM's in bench/results/h200) or cpu (the CPU "
                   "backend's decode and prefill cases)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  bench_cmd
      ->add_option("--kv-pool-gib", bench.kv_pool_gib,
                   "cap of a decode attention case's K|V page pool, GiB (as the peer's)")
      ->check(CLI::Range(0.001, 1024.0));

  app.add_subcommand("info",
                     "Show the build, the visible devices and every registered implementation");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "m3sa: usage error: %s\nRun 'm3sa --help' or 'm3sa demo --help'.\n",
                 e.what());
    return 2;
  }
  if (demo_cmd->parsed()) return m3sa::cli::run_demo(demo);
  if (bench_cmd->parsed())
    return bench.backend == "cpu" ? m3sa::cli::run_cpu_bench(bench) : m3sa::cli::run_bench(bench);
  return print_info();
}
