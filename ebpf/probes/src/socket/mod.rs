//! Socket syscall tracepoints. Entry saves the arguments of traced (process, fd) pairs (or, for
//! reads and writes on kernels with BTF, the exit takes them from the saved registers); exit,
//! which knows how many bytes moved, copies a bounded prefix of them into the ring buffer.
mod args;
mod copy;
mod emit;
mod enter;
mod exit;
mod sock_walk;
mod tls;
mod tls_ties;
mod token;
mod xmit;
