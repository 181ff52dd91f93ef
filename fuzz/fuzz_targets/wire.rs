//! Heartbeat datagrams (anyone on the node may send them) through the agent's decoder. It must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The decoder's own file, compiled alone: depending on hangwatch-agent would build py-spy with fuzzing
// instrumentation (minutes) for a module that needs nothing but thiserror.
#[allow(dead_code)]
#[path = "../../crates/agent/src/wire.rs"]
mod wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = wire::parse_datagram(data) {
        let _ = message.header();
    }
});
