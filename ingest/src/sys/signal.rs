//! SIGINT/SIGTERM → a flag the loops poll, so the daemon stops reading, drains, flushes and
//! exits 0.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
/// The signal that set [`STOP`] (0: none yet).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomic stores: async-signal-safe. The signal first, and the flag with Release, so a
    // thread that sees the flag with Acquire finds the signal ([`stop_signal`]).
    STOP_SIGNAL.store(sig, Ordering::Relaxed);
    STOP.store(true, Ordering::Release);
}

/// The name of the signal that set the stop flag (`SIGTERM`, `SIGINT`), once one has.
pub fn stop_signal() -> Option<&'static str> {
    if !STOP.load(Ordering::Acquire) {
        return None;
    }
    match STOP_SIGNAL.load(Ordering::Relaxed) {
        libc::SIGTERM => Some("SIGTERM"),
        libc::SIGINT => Some("SIGINT"),
        _ => None,
    }
}

/// Installs the handler for SIGINT and SIGTERM and returns the flag it sets.
pub fn stop_flag() -> &'static AtomicBool {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` is an `extern "C"` fn that only performs an atomic store, which is
        // async-signal-safe; `signal` has no other preconditions.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
    &STOP
}

static HUP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hup(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    HUP.store(true, Ordering::Relaxed);
}

/// Installs the SIGHUP handler (reload: the INT source's EVC names) and returns the flag it
/// sets; the main loop swaps it back to false when it acts.
pub fn hup_flag() -> &'static AtomicBool {
    // SAFETY: as in `stop_flag`: the handler only performs an atomic store.
    unsafe {
        libc::signal(libc::SIGHUP, on_hup as *const () as libc::sighandler_t);
    }
    &HUP
}
