//! Traced processes as the host sees them: /proc lookups ([`procfs`]) and a process's sockets
//! asked directly ([`sockets`]); which engine processes to trace and when they start, restart or
//! exit ([`discovery`]); which of their connections are worth decoding ([`fd_class`]); connections
//! held before the agent attached ([`preexisting`]); engines restarted on their port
//! ([`adopt`]); hooks whose function was mapped only later ([`late_attach`]); and the agent's own
//! Unix socket paths, claimed without hijacking another agent's ([`sockpath`]).
pub(crate) mod adopt;
pub(crate) mod discovery;
pub(crate) mod fd_class;
pub(crate) mod late_attach;
pub(crate) mod preexisting;
pub(crate) mod procfs;
pub(crate) mod sockets;
pub(crate) mod sockpath;
