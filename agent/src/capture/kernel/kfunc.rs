//! The kfunc calls of the eBPF object, resolved before loading: aya 0.14 resolves no kfunc
//! calls, so the programs write each call out with a marker where the function's BTF id goes
//! (the eBPF crate's `kfunc.rs`). Here each marked call in the object's code gets the running
//! kernel's id of the function, or, where the kernel lacks it, a register move: the programs
//! reach those calls only behind a load-time flag that is then off, and the verifier rejects
//! an object that names a function the kernel does not have, reached or not.
use inferscope_common::KFUNC_RDONLY_CAST_MARKER;
use object::{Object, ObjectSection, SectionKind};

/// `call` (BPF_JMP | BPF_CALL) with `src_reg` BPF_PSEUDO_KFUNC_CALL and `dst_reg` 0.
const KFUNC_CALL: [u8; 2] = [0x85, 0x20];
/// `r0 = r1` (BPF_ALU64 | BPF_MOV | BPF_X): what the verifier makes of `bpf_rdonly_cast` too.
const MOVE_R1_TO_R0: [u8; 8] = [0xbf, 0x10, 0, 0, 0, 0, 0, 0];
const INSN: usize = 8;

#[derive(Debug, thiserror::Error)]
pub(crate) enum KfuncError {
    #[error("the eBPF object is not a readable ELF file ({0}): rebuild the agent")]
    Object(#[from] object::Error),
    #[error("the eBPF object has no bpf_rdonly_cast call to patch: rebuild the agent")]
    NoCalls,
}

/// An eBPF object with its kfunc calls patched, 8-byte aligned as the ELF reader needs it.
pub(crate) struct PatchedObject {
    words: Vec<u64>,
    len: usize,
    /// How many calls were patched.
    pub calls: usize,
}

impl PatchedObject {
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes (see `patch`), and u8 has no
        // alignment or validity requirements.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the borrow of `self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// `object` with every `bpf_rdonly_cast` call given `rdonly_cast`, the kernel's BTF id of the
/// function, or a register move where that is None.
pub(crate) fn patch(object: &[u8], rdonly_cast: Option<u32>) -> Result<PatchedObject, KfuncError> {
    let mut patched = PatchedObject {
        words: vec![0; object.len().div_ceil(INSN)],
        len: object.len(),
        calls: 0,
    };
    patched.bytes_mut().copy_from_slice(object);
    let code: Vec<(usize, usize)> = object::File::parse(object)?
        .sections()
        .filter(|section| section.kind() == SectionKind::Text)
        .filter_map(|section| section.file_range())
        .filter_map(|(start, len)| Some((usize::try_from(start).ok()?, usize::try_from(len).ok()?)))
        .collect();
    let marker = KFUNC_RDONLY_CAST_MARKER.to_le_bytes();
    let replacement = match rdonly_cast {
        Some(id) => {
            let mut call = [0; INSN];
            call[..2].copy_from_slice(&KFUNC_CALL);
            call[4..].copy_from_slice(&id.to_le_bytes());
            call
        }
        None => MOVE_R1_TO_R0,
    };
    let bytes = patched.bytes_mut();
    let mut calls = 0;
    for (start, len) in code {
        let Some(section) = start
            .checked_add(len)
            .and_then(|end| bytes.get_mut(start..end))
        else {
            continue;
        };
        for insn in section.chunks_exact_mut(INSN) {
            if insn[..4] == [KFUNC_CALL[0], KFUNC_CALL[1], 0, 0] && insn[4..] == marker {
                insn.copy_from_slice(&replacement);
                calls += 1;
            }
        }
    }
    if calls == 0 {
        return Err(KfuncError::NoCalls);
    }
    patched.calls = calls;
    Ok(patched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_object_has_its_calls_patched_and_nothing_else_changed() {
        let object = super::super::probes::program_object();
        for id in [Some(64_927), None] {
            let patched = patch(object, id).unwrap();
            assert!(patched.calls >= 1);
            let changed: Vec<usize> = (0..object.len())
                .step_by(INSN)
                .filter(|&at| {
                    object[at..(at + INSN).min(object.len())]
                        != patched.bytes()[at..(at + INSN).min(object.len())]
                })
                .collect();
            assert_eq!(changed.len(), patched.calls, "only the marked calls change");
            for at in changed {
                let insn = &patched.bytes()[at..at + INSN];
                match id {
                    Some(id) => {
                        assert_eq!(insn[..4], [0x85, 0x20, 0, 0]);
                        assert_eq!(insn[4..], id.to_le_bytes());
                    }
                    None => assert_eq!(insn, MOVE_R1_TO_R0),
                }
            }
            assert_eq!(patched.bytes().as_ptr() as usize % INSN, 0);
        }
    }

    #[test]
    fn not_an_object_is_an_error() {
        assert!(matches!(
            patch(b"not an elf file", None),
            Err(KfuncError::Object(_))
        ));
    }
}
