//! The llama.cpp scheduler functions the agent hooks resolve in the real engine library (the
//! xllamacpp wheel, which keeps its symbol table), by their readable C++ names.

// Test code: a failed setup or check stops the test with the value it did not expect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, process::Command, time::Instant};

use inferscope::testing::ElfSymbols;
use inferscope_integration_tests::engine;

fn xllamacpp_library() -> PathBuf {
    let out = Command::new(engine::python())
        .args([
            "-c",
            "import importlib.util, glob, os; d = os.path.dirname(importlib.util.find_spec('xllamacpp').origin); print(glob.glob(os.path.join(d, 'xllamacpp*.so'))[0])",
        ])
        .output()
        .expect("running the engine's Python (scripts/setup.sh creates .venv)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn llama_cpp_scheduler_hooks_resolve_in_the_real_library() {
    let path = xllamacpp_library();
    let start = Instant::now();
    let table = ElfSymbols::load(&path).expect("loading the engine library's symbols");
    let loaded = start.elapsed();
    assert!(table.has_symtab());
    for (name, expected) in [
        ("server_queue::post(server_task&&, bool)", 1),
        ("server_queue::defer", 1),
        ("server_queue::pop_deferred_task", 1),
        ("server_context_impl::launch_slot_with_task", 1),
        ("server_context_impl::send_partial_response", 1),
        ("server_context_impl::send_final_response", 1),
        ("server_slot::release", 1),
        ("llama_decode", 1),
    ] {
        let found = table.resolve(name);
        assert_eq!(found.len(), expected, "{name}: {found:#?}");
        assert!(found[0].file_offset > 0);
    }
    // Both post overloads (one task, a vector of tasks) under the short name.
    assert_eq!(table.resolve("server_queue::post").len(), 2);
    eprintln!(
        "{}: symbols loaded in {loaded:?}, 9 lookups in {:?}",
        path.display(),
        start.elapsed() - loaded
    );
}
