//! Inspects rank processes on this node without ever blocking on a watched filesystem or stopping a rank:
//! /proc reads, Python stacks in a throwaway child, filesystem probes in sacrificial children.

pub mod dump_files;
pub mod earlier;
pub mod maps;
pub mod namespaces;
pub mod own_dumps;
pub mod paths;
pub mod pickle_shape;
pub mod prepared;
pub mod probe;
pub mod pystack;
pub mod ranks;
pub mod reexec;
pub mod rollcall;
pub mod second_look;
pub mod sockets;
