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

}  // namespace zoe::zero
