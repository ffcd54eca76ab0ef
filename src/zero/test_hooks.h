// Hooks for tests of the engine's error paths (fault injection); never set in production runs.
#pragma once

namespace zoe::io {
class FaultInjector;
}

namespace zoe::zero {

// Engines created after this call give `f` to their I/O engine (nullptr: none). Process-wide,
// not owned; f must outlive those engines. Not thread-safe against concurrent Engine::create.
void set_engine_io_faults(io::FaultInjector* f);
io::FaultInjector* engine_io_faults();

// Engines created after set_deferred_device_ops(true) run their CPU device ops in the deferred
// mode (zero/device_ops.h: every op runs only at the next synchronize()), so that a hand-off the
// engine does not synchronize gives wrong bytes on the CPU device too. Process-wide.
void set_deferred_device_ops(bool on);
bool deferred_device_ops();

}  // namespace zoe::zero
