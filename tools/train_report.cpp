// `zoe train`, the run's report: its JSON (--json, --plot's input), the --plot curves, and the
// text summary (loss and accuracy reached, samples, the memory and traffic table).
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "tools/train_run.h"

namespace zoe::cli {

using nlohmann::json;

namespace {

json buffers_json(const BufferSizes& b) {
  return {{"host_share", b.host_share},
          {"swap_buffer_count", b.swap_buffer_count},
          {"swap_buffer_bytes", b.swap_buffer_bytes},
          {"swap_async_buffers", b.swap_async_buffers},
          {"staging_count", b.staging_count},
          {"staging_bytes", b.staging_bytes},
          {"host_cache_bytes", b.host_cache_bytes},
          {"chosen", b.chosen}};
}

}  // namespace

// The run's JSON (--json, and --plot's input).
json TrainRun::summary_json() const {
  json j;
  j["params"] = mc.num_params();
  j["model"] = {
      {"layers", mc.layers}, {"d_model", mc.d_model}, {"heads", mc.heads}, {"context", mc.seq}, {"seq", T}};
  j["world_size"] = rt->world_size();
  j["stage"] = cfg.stage();
  j["offload"] = {{"optimizer", offload_name(cfg.offload_optimizer())},
                  {"param", offload_name(cfg.offload_param())}};
  j["precision"] = dtype_name(cfg.precision());
  j["micro_batch"] = o.micro_batch;
  j["gradient_accumulation_steps"] = accum;
  j["schedule"] = eng->schedule();
  j["lr"] = cfg.lr();
  if (eng->optimizer() == "Muon") {  // the matrices' rate, and the auxiliary AdamW's
    if (auto v = cfg.get_double("optimizer.params.muon_lr"); v.is_ok()) j["lr"] = v.value();
    if (auto v = cfg.get_double("optimizer.params.adam_lr"); v.is_ok()) j["adam_lr"] = v.value();
  }
  j["data"] = corpus.name;
  j["model_state_bytes"] = eng->model_state_bytes();
  j["optimizer"] = eng->optimizer();
  j["optimizer_states"] = eng->optimizer_states();
  j["master_weights"] = eng->master_weights();
  j["optimizer_state_bytes_per_param"] = eng->optimizer_state_bytes_per_param();
  j["device_budget_bytes"] = eng->device_budget_bytes();
  j["state_to_budget"] =
      static_cast<double>(eng->model_state_bytes()) / static_cast<double>(eng->device_budget_bytes());
  j["buffers"] = buffers_json(eng->buffer_sizes());
  j["high_water_bytes"] = {
      {"device", last.high_water[0]}, {"host", last.high_water[1]}, {"nvme", last.high_water[2]}};
  j["bytes_moved"] = {{"nvme->host", last.bytes_nvme_read},
                      {"host->nvme", last.bytes_nvme_write},
                      {"host->device", last.bytes_host_to_device},
                      {"device->host", last.bytes_device_to_host}};
  // The last step's (the steady state: the first steps record the fetch order and fill caches).
  j["bytes_per_param_per_step"] = per_param.empty() ? json::object() : per_param.back();
  j["step_bytes_per_param"] = per_param;
  j["time_s"] = {{"compute", t_compute}, {"comm", t_comm},   {"io_stall", t_io},
                 {"optimizer", t_opt},   {"total", total_s}, {"initialize", init_s}};
  j["losses"] = losses;
  j["lrs"] = lrs;
  j["grad_norms"] = grad_norms;
  j["step_time_s"] = step_times;
  j["comm_s_by_rank"] = comm_by_rank;
  // The last step's StepStats, every field (zoe/step_stats.h).
  j["step_stats"] = json::parse(step_stats_json(last));
  add_activation_json(&j);
  add_wear_json(&j);
  j["eval_loss"] = eval_loss;
  if (!std::isnan(accuracy)) j["accuracy"] = accuracy;
  j["evals"] = evals;
  if (sample_n > 0) {
    j["samples"] = samples;
    j["prompt"] = escape_bytes(o.prompt);
    j["temperature"] = o.temperature;
  }
  const model::CpuKernelSet ks = model::cpu_kernel_set();
  j["kernels"] = {{"simd", ks.simd}, {"blas", ks.blas}};
  j["steps"] = o.steps;
  j["start_step"] = start_step;
  j["tokens_per_s"] =
      static_cast<double>(o.steps - start_step) * o.micro_batch * T * accum * rt->world_size() / total_s;
  return j;
}

// The activation store's figures: the checkpointed bytes of a micro-batch (wherever they live),
// its high-water marks per tier, its bytes per link and its stall over the run (0 without
// checkpointing).
void TrainRun::add_activation_json(json* j) const {
  const ActivationStats a = eng->activations().stats();
  (*j)["activation_checkpoint_bytes"] = a.checkpoint_bytes;
  (*j)["high_water_bytes"]["activation_device"] = a.high_water_device;
  (*j)["high_water_bytes"]["activation_host"] = a.high_water_host;
  (*j)["high_water_bytes"]["activation_nvme"] = a.high_water_nvme;
  (*j)["activation_bytes_moved"] = {{"device->host", a.bytes_device_to_host},
                                    {"host->device", a.bytes_host_to_device},
                                    {"host->nvme", a.bytes_nvme_write},
                                    {"nvme->host", a.bytes_nvme_read}};
  (*j)["time_s"]["activation_stall"] = a.t_stall;
}

// This rank's bytes written to NVMe since the engine started: the engine's counter (optimizer
// states, stage-3 partitions, gradient accumulation) and the activation store's.
uint64_t TrainRun::nvme_written() const {
  return last.bytes_nvme_write + eng->activations().stats().bytes_nvme_write;
}

// zoe.drive_tbw: the terabytes the NVMe drive is rated to write; 0: not given.
double TrainRun::drive_tbw() const {
  auto v = cfg.get_double("zoe.drive_tbw");
  return v.is_ok() ? v.value() : 0.0;
}

// The drive's wear: the bytes written to NVMe, per step, and with zoe.drive_tbw the share of the
// rated endurance every rank's writes used (as if on one drive: exact for ranks sharing a host's
// drive, an upper bound across hosts).
void TrainRun::add_wear_json(json* j) const {
  (*j)["nvme_bytes_written"] = nvme_written();
  (*j)["nvme_bytes_written_by_step"] = nvme_written_steps;
  if (rt->world_size() > 1) (*j)["nvme_bytes_written_all_ranks"] = nvme_written_all;
  if (drive_tbw() > 0) {
    (*j)["drive_tbw"] = drive_tbw();
    (*j)["drive_endurance_used"] = nvme_written_all / (drive_tbw() * 1e12);
  }
}

// One line of the summary: the bytes written to NVMe, and the share of zoe.drive_tbw they used.
void TrainRun::print_wear() const {
  const uint64_t per_step = nvme_written_steps.empty() ? 0 : nvme_written_steps.back();
  printf("nvme written    %s by this rank in %zu steps (%s in the last step)",
         format_bytes(nvme_written()).c_str(), nvme_written_steps.size(), format_bytes(per_step).c_str());
  if (drive_tbw() > 0) {
    printf("; %.3g%% of a %g TB drive's rated endurance (zoe.drive_tbw)%s",
           100 * nvme_written_all / (drive_tbw() * 1e12), drive_tbw(),
           rt->world_size() > 1 ? ", every rank's writes" : "");
  }
  printf("\n");
}

// --plot: the run's curves drawn from its JSON.
void TrainRun::plot(const json& j) const {
  if (o.plot.empty()) return;
  Progress plotting(!o.quiet);
  plotting.update("plotting " + o.plot);
  Status ps = write_plot("train", j.dump(), o.plot);
  plotting.done();
  if (!ps.is_ok()) fail(ps.with_context("--plot " + o.plot));
}

// The text summary: what was trained, the loss and accuracy it reached, the samples, the bytes.
void TrainRun::print_summary(const json& j) const {
  printf("# zoe train: %s, %llu parameters (%d layers, d %d, %d heads), seq %d, %s, world %d\n",
         corpus.name.c_str(), static_cast<unsigned long long>(mc.num_params()), mc.layers, mc.d_model,
         mc.heads, T, j["precision"].get<std::string>().c_str(), rt->world_size());
  printf("loss            %.4f -> %.4f over steps %d-%d; eval loss %.4f", losses.front(), losses.back(),
         start_step + 1, o.steps, eval_loss);
  if (!std::isnan(accuracy)) printf("; exact-match accuracy %.1f%%", 100 * accuracy);
  printf("\n");
  if (!std::isnan(accuracy) && !std::isnan(accuracy_start)) {
    printf(
        "learned         exact-match accuracy on held-out additions %.1f%% -> %.1f%% in %d steps (%.0fs)\n",
        100 * accuracy_start, 100 * accuracy, o.steps - start_step, total_s);
  }
  if (sample_n > 0) print_samples();
  print_wear();
  printf("\n");
  print_bytes_table(j);
}

// Each sample's text, and (on a text corpus) how many of its words the text has, first to last.
void TrainRun::print_samples() const {
  for (const json& sm : samples) {
    printf("sample          after step %d (temperature %g", sm["step"].get<int>(), o.temperature);
    if (!corpus.arithmetic) {
      printf("; %.0f%% of its %zu words occur in the text", 100 * sm["known_words"].get<double>(),
             sm["words"].get<size_t>());
    }
    printf("):\n");
    print_indented(sm["text"].get<std::string>(), "                | ");
  }
  const json &a = samples.front(), &b = samples.back();
  if (!corpus.arithmetic)
    printf("learned         words of a sample found in the text %.0f%% -> %.0f%%",
           100 * a["known_words"].get<double>(), 100 * b["known_words"].get<double>());
  if (!corpus.arithmetic) {
    if (!std::isnan(eval_loss_start)) printf("; eval loss %.3f -> %.3f", eval_loss_start, eval_loss);
    printf(" in %d steps (%.0fs)\n", o.steps - start_step, total_s);
  }
}

// The memory and traffic table, bytes per parameter of the last step, and where the time went.
void TrainRun::print_bytes_table(const json& j) const {
  Table t({{"", "", 22, true}, {"bytes", "", 14}, {"", "", 10}});
  t.print_header(stdout);
  auto row = [&](const std::string& name, uint64_t v) {
    t.print_row(stdout, {name, std::to_string(v), format_bytes(v)});
  };
  row("model state / rank", eng->model_state_bytes());
  row("device budget", eng->device_budget_bytes());
  row("device high water", last.high_water[0]);
  row("host high water", last.high_water[1]);
  row("nvme high water", last.high_water[2]);
  row("moved nvme->host", last.bytes_nvme_read);
  row("moved host->nvme", last.bytes_nvme_write);
  row("moved host->device", last.bytes_host_to_device);
  if (ckpt) {  // the activation store
    const ActivationStats a = eng->activations().stats();
    row("checkpoints / micro", a.checkpoint_bytes);
    row("activation dev hw", a.high_water_device);
    row("activation host hw", a.high_water_host);
    row("activation nvme hw", a.high_water_nvme);
    row("activations to nvme", a.bytes_nvme_write);
    printf("activation checkpointing, offload %s: stall %.2fs over the run\n",
           activation_offload_name(eng->activations().offload()), a.t_stall);
  }
  printf(
      "\nbytes per parameter in the last step: nvme->host %.2f, host->nvme %.2f, host->device %.2f, "
      "device->host %.2f",
      last.per_param_nvme_read, last.per_param_nvme_write, last.per_param_host_to_device,
      last.per_param_device_to_host);
  printf(
      "\nstate / device budget = %.1fx; time: compute %.1fs, comm %.1fs, I/O stall %.1fs, optimizer %.1fs, "
      "total %.1fs\n",
      j["state_to_budget"].get<double>(), t_compute, t_comm, t_io, t_opt, total_s);
}

}  // namespace zoe::cli
