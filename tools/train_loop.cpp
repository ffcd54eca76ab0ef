// `zoe train`, the training loop: the steps (micro-batches, optimizer step, statistics, progress
// line), the evaluations, samples and checkpoints they are due, the stop every rank agrees on at a
// step boundary (SIGINT/SIGTERM, a loss that is not finite), and the run's end.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/train_run.h"

namespace zoe::cli {

using nlohmann::json;

namespace {

// The bytes per parameter one step moved, per link (a row of the JSON's step_bytes_per_param).
json link_json(double nvme_read, double nvme_write, double h2d, double d2h) {
  return json{
      {"nvme->host", nvme_read}, {"host->nvme", nvme_write}, {"host->device", h2d}, {"device->host", d2h}};
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// A sample from --prompt (a collective: every rank draws the same), and how many of its words
// occur in the training text.
void TrainRun::take_sample(int at_step) {
  progress->update(fmt("sampling %d bytes from the weights after step %d", sample_n, at_step));
  std::string text = value_or_fail(trainer->sample(o.prompt, sample_n, o.temperature, o.seed, o.micro_batch));
  size_t words = 0;
  const double known = data::known_word_fraction(text, corpus.train, &words);
  samples.push_back(
      {{"step", at_step}, {"text", escape_bytes(o.prompt + text)}, {"words", words}, {"known_words", known}});
}

// The held-out loss over --eval-batches, and on the arithmetic corpus the exact-match accuracy
// (a line counts when every answer token is the argmax), both averaged over the ranks.
void TrainRun::evaluate() {
  double sum = 0;
  int n = 0;
  int correct = 0, total = 0;
  for (int b = 0; b < o.eval_batches; ++b) {
    std::vector<int32_t> tk, tg, line;
    if (corpus.arithmetic) {
      data::arithmetic_eval_batch(corpus.eval, o.micro_batch, T, static_cast<size_t>(b * o.micro_batch * 4),
                                  &tk, &tg, &line);
    } else {
      data::sample_batch(corpus.eval, o.micro_batch, T, o.seed ^ 0xe7a1, static_cast<uint64_t>(b), 0, 0, &tk,
                         &tg);
    }
    float l = value_or_fail(trainer->forward(tk, tg));
    sum += l;
    ++n;
    if (corpus.arithmetic) {
      const float* logits = gpt->logits();
      std::vector<int> ok(tk.size(), 1);
      int lines = 0;
      for (size_t i = 0; i < line.size(); ++i) {
        if (line[i] < 0) continue;
        lines = std::max(lines, line[i] + 1);
        const float* row = logits + i * static_cast<size_t>(mc.vocab);
        int arg = static_cast<int>(std::max_element(row, row + mc.vocab) - row);
        if (arg != tg[i]) ok[static_cast<size_t>(line[i])] = 0;
      }
      for (int k = 0; k < lines; ++k) correct += ok[static_cast<size_t>(k)];
      total += lines;
    }
  }
  eval_loss = mean_over_ranks(*rt, sum / std::max(1, n));
  if (corpus.arithmetic && total > 0) accuracy = mean_over_ranks(*rt, static_cast<double>(correct) / total);
}

// A checkpoint after step `done`, tagged step-NNNNNN, with the trainer's state (step, seed, data).
void TrainRun::save_after(int done, bool async) {
  json ts = {{"step", done}, {"seed", o.seed}, {"data", corpus.name}, {"preset", o.preset}};
  char tag[32];
  snprintf(tag, sizeof(tag), "step-%06d", done);
  progress->update(std::string("saving ") + tag + " to " + o.save_dir);
  Status ss = eng->save(o.save_dir, tag, ts.dump(), async);
  if (!ss.is_ok()) {
    progress->done();
    fail(ss.with_context("saving a checkpoint after step " + std::to_string(done)));
  }
  saved_step = done;
}

// SIGINT/SIGTERM stop the run at the next step boundary; SIGTERM saves a final checkpoint
// first when there is a --save-dir. Unwinding destroys the engine, which removes swap files.
// Several ranks agree at each boundary (agree_on_stop): a signal to one rank alone (a batch
// system signals them one at a time) stops every rank after the same step, together.
void TrainRun::stop_if_asked(int done) {
  std::string which;
  const int sig = rt->world_size() > 1 ? agree_on_stop(&which) : stop.requested();
  if (sig == 0) return;
  stop.stopping();
  std::string saved;
  if (sig == SIGTERM && !o.save_dir.empty() && done > start_step && saved_step != done) {
    save_after(done, false);
    saved = fmt("; checkpoint step-%06d saved in %s", done, o.save_dir.c_str());
  }
  Status fs = eng->finish_save();
  progress->done();
  if (!fs.is_ok()) fail(fs.with_context("the last checkpoint, while stopping"));
  dump->close();  // the batches of the steps that ran
  eng.reset();
  throw CommandError{Status(StatusCode::kCancelled,
                            fmt("stopped by %s after step %d of %d%s%s", sig == SIGINT ? "SIGINT" : "SIGTERM",
                                done, o.steps, which.c_str(), saved.c_str())),
                     128 + sig};
}

// The stop every rank agrees on at a step boundary: each rank's signal (0: none) summed over the
// ranks, one slot per rank. SIGTERM when any rank got one (it saves a checkpoint), else SIGINT,
// else 0. `which` names the ranks that got a signal when not all of them did ("" otherwise). The
// collective is one value per rank, a few microseconds against a step.
int TrainRun::agree_on_stop(std::string* which) {
  const int world = rt->world_size();
  std::vector<double> got(static_cast<size_t>(world), 0.0);
  got[static_cast<size_t>(rt->rank())] = stop.requested();
  Status s = rt->sum(&got);
  if (!s.is_ok()) fail(s.with_context("agreeing over the ranks whether a signal stops the run"));
  std::vector<int> ranks;
  int sig = 0;
  for (int r = 0; r < world; ++r) {
    const int g = static_cast<int>(got[static_cast<size_t>(r)]);
    if (g == 0) continue;
    ranks.push_back(r);
    if (sig != SIGTERM) sig = g;
  }
  which->clear();
  if (sig == 0 || static_cast<int>(ranks.size()) == world) return sig;
  std::string list;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) list += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) list += fmt(" and %zu more", ranks.size() - 8);
  *which = fmt(" (the signal reached rank%s %s of %d; every rank stops after this step)",
               ranks.size() > 1 ? "s" : "", list.c_str(), world);
  return sig;
}

// The training loop: --save-initial, the evaluation of the starting weights (with --eval-every),
// then the steps.
void TrainRun::train() {
  accum = static_cast<int>(std::max<int64_t>(1, cfg.gradient_accumulation_steps()));
  t_start = clock_ns();
  stderr_tty = isatty(STDERR_FILENO) != 0;
  progress_every = std::max(1, (o.steps - start_step) / 10);
  last_line_s = now_s();
  if (o.save_initial) save_after(0, false);
  // With --eval-every, the first evaluation is of the weights the run starts from.
  if (o.eval_every > 0) {
    progress->update("evaluating the initial weights");
    evaluate();
    json ev = {{"step", start_step}, {"eval_loss", eval_loss}};
    if (!std::isnan(accuracy)) ev["accuracy"] = accuracy;
    evals.push_back(ev);
    accuracy_start = accuracy;
    eval_loss_start = eval_loss;
  }
  for (int step = start_step; step < o.steps; ++step) train_step(step);
}

// The forward and backward of step `step`'s micro-batches, in the order zoe.schedule names; the sum
// of their losses.
double TrainRun::micro_batches(int step) {
  const bool layer_major = models.size() > 1;
  std::vector<std::vector<int32_t>> all_tokens, all_targets;
  double loss_sum = 0;
  for (int micro = 0; micro < accum; ++micro) {
    data::sample_batch(corpus.train, o.micro_batch, T, o.seed, static_cast<uint64_t>(step), rt->rank(), micro,
                       &tokens, &targets);
    dump->write(step, rt->rank(), micro, o.micro_batch, T, tokens, targets);
    if (layer_major) {
      all_tokens.push_back(tokens);
      all_targets.push_back(targets);
      continue;
    }
    auto l = trainer->forward_backward(tokens, targets);
    if (!l.is_ok()) {
      progress->done();
      fail(l.status().with_context("training step " + std::to_string(step + 1)));
    }
    loss_sum += l.value();
  }
  if (!layer_major) return loss_sum;
  auto l = trainer->forward_backward_layer_major(all_tokens, all_targets, models);
  if (!l.is_ok()) {
    progress->done();
    fail(l.status().with_context("training step " + std::to_string(step + 1)));
  }
  for (float x : l.value()) loss_sum += x;
  return loss_sum;
}

// One step: the micro-batches' forward and backward, the optimizer step, its statistics, the
// evaluation and checkpoint it is due, and its progress line.
void TrainRun::train_step(int step) {
  stop_if_asked(step);
  const double step_t0 = now_s();
  const double loss_sum = micro_batches(step);
  auto st = eng->step();
  if (!st.is_ok()) {
    progress->done();
    fail(st.status().with_context("optimizer step " + std::to_string(step + 1)));
  }
  last = st.value();
  const double step_wall = now_s() - step_t0;
  double loss = mean_over_ranks(*rt, loss_sum / accum);
  losses.push_back(loss);
  record_step(step_wall);
  stop_if_not_finite(step, loss);
  if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
    evaluate();
    json ev = {{"step", step + 1}, {"eval_loss", eval_loss}};
    if (!std::isnan(accuracy)) ev["accuracy"] = accuracy;
    evals.push_back(ev);
  }
  if (o.save_every > 0 && (step + 1) % o.save_every == 0) save_after(step + 1, o.save_async);
  progress_line(step, loss);
}

// A step whose loss or gradient norm is NaN or inf stops the run (exit 1): without fp16's dynamic
// loss scaler, which skips such a step and lowers the scale, the update has already spread it into
// the weights and every later step would report it, rc 0. Every rank sees the same values.
void TrainRun::stop_if_not_finite(int step, double loss) {
  if (std::isfinite(loss) && std::isfinite(last.grad_norm)) return;
  const auto static_scale = cfg.get_double("fp16.loss_scale");
  const bool dynamic_scaler =
      cfg.precision() == ComputeDType::kF16 && static_scale.is_ok() && static_scale.value() == 0;
  if (dynamic_scaler && last.skipped) return;
  progress->done();
  fail(invalid_argument(
      "zoe train stopped at step %d of %d: the loss is %g and the gradient norm %g, not finite numbers (%s); "
      "check optimizer.params (lr, weight_decay), gradient_clipping and the data",
      step + 1, o.steps, loss, last.grad_norm,
      dynamic_scaler ? "the fp16 loss scaler did not skip the step"
                     : "no fp16 dynamic loss scaler (fp16.enabled with loss_scale 0) skips such steps"));
}

// The step's statistics kept for the JSON: learning rate, gradient norm, times, bytes per parameter.
void TrainRun::record_step(double step_wall) {
  lrs.push_back(last.lr);
  grad_norms.push_back(last.grad_norm);
  step_times.push_back({{"compute", last.t_compute},
                        {"comm", last.t_comm},
                        {"io_stall", last.t_io_stall},
                        {"optimizer", last.t_optimizer},
                        {"newton_schulz", last.t_newton_schulz},
                        {"wall", step_wall}});
  per_param.push_back(link_json(last.per_param_nvme_read, last.per_param_nvme_write,
                                last.per_param_host_to_device, last.per_param_device_to_host));
  nvme_written_steps.push_back(last.step_bytes_nvme_write + last.activation_bytes_nvme_write);
  comm_steps.push_back(last.t_comm);
  t_compute += last.t_compute;
  t_comm += last.t_comm;
  t_io += last.t_io_stall;
  t_opt += last.t_optimizer;
}

// The step's progress line: loss, tokens/s, NVMe rate, I/O stall share, ETA and the last
// evaluation. On a terminal every step; otherwise only the steps due.
void TrainRun::progress_line(int step, double loss) {
  double elapsed = static_cast<double>(clock_ns() - t_start) * 1e-9;
  double step_time = elapsed / (step + 1 - start_step);
  stop.note_step(step_time);
  double tokens_s =
      static_cast<double>(o.micro_batch) * T * accum * rt->world_size() / std::max(step_time, 1e-9);
  uint64_t nvme = last.bytes_nvme_read + last.bytes_nvme_write;
  double nvme_gbps = static_cast<double>(nvme - last_nvme) / std::max(step_time, 1e-9) * 1e-9;
  last_nvme = nvme;
  double wall_step = last.t_compute + last.t_comm + last.t_io_stall + last.t_optimizer;
  double stall = wall_step > 0 ? 100.0 * last.t_io_stall / wall_step : 0;
  std::string line =
      fmt("step %d/%d  loss %.4f  %.0f tok/s  nvme %.2f GB/s  stall %.0f%%  eta %s", step + 1, o.steps, loss,
          tokens_s, nvme_gbps, stall, fmt_eta(step_time * (o.steps - step - 1)).c_str());
  if (!std::isnan(eval_loss)) line += fmt("  eval %.4f", eval_loss);
  if (!std::isnan(accuracy)) line += fmt(" acc %.1f%%", 100 * accuracy);
  // Not a terminal (a log, CI): one line every progress_every steps and the last, not one per step.
  // The first steps show at once (the first result), then every progress_every steps, and at
  // least one line every 10 s of a long run.
  const bool due = (step + 1 - start_step) <= 3 || (step + 1) % progress_every == 0 || step + 1 == o.steps ||
                   now_s() - last_line_s >= 10.0;
  if (stderr_tty || due) {
    progress->update(line);
    last_line_s = now_s();
  }
}

// Every rank's t_comm per step, to every rank: a rank waiting for a slower one counts that wait
// as communication, so the ranks' times differ.
void TrainRun::gather_comm() {
  // One row of --steps per rank, the same size on every rank whatever steps each ran.
  const size_t w = static_cast<size_t>(rt->world_size());
  const size_t row = static_cast<size_t>(std::max(o.steps, 1));
  const size_t n = std::min(comm_steps.size(), row);
  std::vector<double> all(row * w, 0.0);
  std::copy(comm_steps.begin(), comm_steps.begin() + static_cast<ptrdiff_t>(n),
            all.begin() + static_cast<ptrdiff_t>(row * rt->rank()));
  Status s = rt->sum(&all);
  if (!s.is_ok()) fail(s.with_context("gathering every rank's communication time"));
  for (size_t r = 0; r < w; ++r)
    comm_by_rank.push_back(std::vector<double>(all.begin() + static_cast<ptrdiff_t>(row * r),
                                               all.begin() + static_cast<ptrdiff_t>(row * r + n)));
}

// After the last step: the pending checkpoint, the final evaluation and sample, --trace.
void TrainRun::finish() {
  gather_comm();
  std::vector<double> written = {static_cast<double>(nvme_written())};
  Status ws = rt->sum(&written);
  if (!ws.is_ok()) fail(ws.with_context("summing every rank's NVMe bytes written"));
  nvme_written_all = written[0];
  Status fs = eng->finish_save();
  if (!fs.is_ok()) fail(fs.with_context("the last checkpoint"));
  progress->done();
  dump->close();
  if (o.eval_every <= 0) evaluate();
  if (sample_n > 0) take_sample(o.steps);
  if (!o.trace.empty()) {
    Status ts = eng->write_trace(o.trace + (rt->world_size() > 1 ? "." + std::to_string(rt->rank()) : ""));
    if (!ts.is_ok()) fail(ts.with_context("--trace"));
  }
}

}  // namespace zoe::cli
