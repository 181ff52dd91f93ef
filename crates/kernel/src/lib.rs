//! Kernel knowledge of hangwatch, as data and small pure lookups: system call tables ([`syscall`]), the frames of
//! kernel stacks that say nothing of where a task waits ([`frames`]), and filesystems as stacks and mount tables
//! show them ([`filesystem`]). Each fact is written here once; the parsers (`proc`, `kmsg`) and decisions
//! (`diagnosis`, `history`) read it. This crate depends on no other crate of hangwatch.

pub mod filesystem;
pub mod frames;
pub mod syscall;
