//! Ctrl-C as a request to stop cleanly: the first SIGINT sets a flag that long runs poll (they save
//! a checkpoint and return); a second one ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the first Ctrl-C.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    // A second Ctrl-C ends the process at once. SAFETY: signal(2) is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}

/// Installs the handler.
pub fn install() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
}
