//! Socket syscall tracepoints. Entry saves the arguments of traced (process, fd) pairs; exit,
//! which knows how many bytes moved, copies a bounded prefix of them into the ring buffer.
mod copy;
mod enter;
mod exit;
mod sock_walk;
mod tls;
mod token;
