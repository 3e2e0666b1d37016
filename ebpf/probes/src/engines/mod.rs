//! Scheduler uprobes, one module per engine: each knows where its engine keeps a task's id.
//! `user` runs the probes of a user-written spec file.
mod llamacpp;
mod user;
