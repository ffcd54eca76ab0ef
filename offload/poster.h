// Poster: the tier manager's one worker thread, which finishes what completions start. The I/O
// engine's reaper and device stream callbacks post() their work here instead of doing it, so a
// completion never takes the manager's lock (it could wait for a thread that waits for that very
// completion) and a stream callback never calls the device API (CUDA forbids it).
//
// Thread-safe. post() takes only the queue's own lock, a leaf: nothing is called while it is held.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "device/device.h"
#include "zoe/status.h"

namespace zoe::offload {

class Poster {
 public:
  Poster();   // starts the thread
  ~Poster();  // stop()
  Poster(const Poster&) = delete;
  Poster& operator=(const Poster&) = delete;

  // Queues fn; the poster thread runs the queue in order, one at a time. fn may post().
  void post(std::function<void()> fn);
  // Posts fn once stream s reaches this point (a host callback that only posts).
  [[nodiscard]] Status after(device::Stream& s, std::function<void()> fn);
  // Runs the queue (and what its work posts) until it is empty, then ends the thread; later
  // posts never run. Idempotent; called from one thread, never the poster thread itself.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the queue exists
};

}  // namespace zoe::offload
