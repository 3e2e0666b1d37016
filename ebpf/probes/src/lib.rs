#![no_std]
// The programs live in the `inferscope` binary target; this empty library lets the agent take a
// build-dependency on the package so cargo rebuilds the agent when the programs change.
