//! Scheduler uprobes, one module per engine: each knows where its engine keeps a task's id.
mod llamacpp;
