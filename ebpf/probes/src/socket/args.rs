//! A read's or write's arguments and thread, taken at the syscall's exit from the current task
//! (its ids) and the user registers the kernel saved at the syscall's entry (fd, buffer,
//! count: the syscall ABI preserves them, and the kernel restores them on return). So reads
//! and writes need no entry program: every read and write of the host runs one program instead
//! of two, and a captured one saves the in-flight slot's store and load and a clock read
//! (BENCHMARKS §29, §30). A write's time then comes from its socket ([`super::xmit`]).
//!
//! Loads through the typed pointers `bpf_get_current_task_btf` and `bpf_task_pt_regs` return
//! (5.15+): the verifier checks each against the kernel's BTF, which needs the offsets to be
//! constants: they are read-only globals that user space sets from the same BTF at load time
//! (a frozen map the verifier reads as constants). Where user space finds no such BTF, the
//! exit programs that use this are neither loaded nor attached, and entry programs save the
//! arguments as before.
//!
//! The saved registers sit at the same offset from the top of every task's kernel stack. Where
//! the kernel has `bpf_rdonly_cast` (6.2+), the first call learns that offset from
//! `bpf_task_pt_regs` and later ones find the registers from `task_struct.stack` and the offset
//! through a typed pointer: one helper call fewer per read and write (~16 ns here, BENCHMARKS
//! §32).
use aya_ebpf::{
    helpers::generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    macros::map,
    maps::Array,
};

use crate::kfunc::rdonly_cast;

/// `task_struct.pid` and `.tgid` (the thread and process ids `bpf_get_current_pid_tgid` gives).
#[unsafe(no_mangle)]
static EXIT_ARGS_TASK_PID: u32 = 0;
#[unsafe(no_mangle)]
static EXIT_ARGS_TASK_TGID: u32 = 0;
/// Where `struct pt_regs` keeps the first three syscall arguments at exit (x86_64: di, si, dx).
#[unsafe(no_mangle)]
static EXIT_ARGS_REG0: u32 = 0;
#[unsafe(no_mangle)]
static EXIT_ARGS_REG1: u32 = 0;
#[unsafe(no_mangle)]
static EXIT_ARGS_REG2: u32 = 0;
/// `task_struct.stack`, and the BTF id of `struct pt_regs` where user space patched in
/// `bpf_rdonly_cast` (0: the helper finds the registers every time).
#[unsafe(no_mangle)]
static EXIT_ARGS_TASK_STACK: u32 = 0;
#[unsafe(no_mangle)]
static EXIT_ARGS_PT_REGS_TYPE: u32 = 0;

/// How far above `task_struct.stack` the saved user registers sit (the same for every task:
/// the stack's size less its top padding and the registers' size), learnt from the first
/// `bpf_task_pt_regs`; 0 until then.
#[map]
static REGS_ABOVE_STACK: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
fn offset(global: &u32) -> usize {
    // SAFETY: a valid, aligned static; the volatile load keeps the value user space set at load
    // time from being folded to the compiled-in default.
    (unsafe { core::ptr::read_volatile(global) }) as usize
}

/// The current thread, as the kernel's typed pointer to its `task_struct`.
#[derive(Clone, Copy)]
pub struct Task(*const u8);

impl Task {
    #[inline(always)]
    pub fn current() -> Self {
        // SAFETY: takes no arguments; the result is never null in a syscall's context.
        Self(unsafe { bpf_get_current_task_btf() } as *const u8)
    }

    /// (tgid << 32) | tid, as `bpf_get_current_pid_tgid` returns it.
    #[inline(always)]
    pub fn pid_tgid(self) -> u64 {
        // SAFETY: loads of two `pid_t` members through the typed task pointer: the verifier
        // checks offset and size against the task_struct's BTF.
        unsafe {
            let pid =
                core::ptr::read_volatile(self.0.add(offset(&EXIT_ARGS_TASK_PID)).cast::<u32>());
            let tgid =
                core::ptr::read_volatile(self.0.add(offset(&EXIT_ARGS_TASK_TGID)).cast::<u32>());
            (u64::from(tgid) << 32) | u64::from(pid)
        }
    }

    /// The task's saved user registers, as a typed pointer.
    #[inline(always)]
    fn regs(self) -> *const u8 {
        let pt_regs = offset(&EXIT_ARGS_PT_REGS_TYPE) as u32;
        if pt_regs != 0
            && let Some(above) = REGS_ABOVE_STACK.get_ptr_mut(0)
        {
            // SAFETY: a `void *` member's load through the typed task pointer (the verifier
            // checks it against task_struct's BTF and reads it as a number); the map value
            // pointer is valid for the program's run.
            unsafe {
                let stack = core::ptr::read_volatile(
                    self.0.add(offset(&EXIT_ARGS_TASK_STACK)).cast::<u64>(),
                );
                let learnt = *above;
                if learnt != 0 {
                    return rdonly_cast(stack + learnt, pt_regs);
                }
                // SAFETY: the helper takes the typed task pointer.
                let regs = bpf_task_pt_regs(self.0 as *mut _) as *const u8;
                // The pointer goes through the map value to become a number: verifiers before
                // 7.x refuse a typed pointer minus a number they cannot bound ("math between
                // ptr_ pointer and register with unbounded min value"), and a privileged
                // program may store a pointer in a map. Every CPU's first call writes the
                // same number.
                core::ptr::write_volatile(above, regs as u64);
                let address = core::ptr::read_volatile(above);
                core::ptr::write_volatile(above, address.wrapping_sub(stack));
                return regs;
            }
        }
        // SAFETY: the helper takes the typed task pointer and returns a typed pointer to the
        // task's saved user registers.
        unsafe { bpf_task_pt_regs(self.0 as *mut _) as *const u8 }
    }

    /// The syscall's first three arguments, as the thread passed them.
    #[inline(always)]
    pub fn syscall_args(self) -> [u64; 3] {
        // SAFETY: loads through the typed pointer to the saved registers, checked against
        // pt_regs' BTF.
        unsafe {
            let regs = self.regs();
            [
                core::ptr::read_volatile(regs.add(offset(&EXIT_ARGS_REG0)).cast::<u64>()),
                core::ptr::read_volatile(regs.add(offset(&EXIT_ARGS_REG1)).cast::<u64>()),
                core::ptr::read_volatile(regs.add(offset(&EXIT_ARGS_REG2)).cast::<u64>()),
            ]
        }
    }
}
