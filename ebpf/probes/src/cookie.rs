//! The attach cookie: which function, probe or struct layout a uprobe program was attached for.
//! `bpf_get_attach_cookie` came with 5.15; the build for older kernels (feature `legacy`) never
//! calls it, since a program that names a helper the kernel lacks is refused whole. There every
//! program reads 0: user space attaches such a program only where the cookie it would pass is 0
//! (a struct member at offset 0, the first user probe), and programs whose cookie picks among
//! functions (the TLS probes) are built once per cookie instead (`socket::tls`).

/// The running program's attach cookie (0 in the build for kernels before 5.15).
#[inline(always)]
pub fn get(ctx: *mut core::ffi::c_void) -> u64 {
    #[cfg(not(feature = "legacy"))]
    // SAFETY: the context is the running program's own, as the helper requires; no memory is
    // touched.
    unsafe {
        aya_ebpf::helpers::bpf_get_attach_cookie(ctx)
    }
    #[cfg(feature = "legacy")]
    {
        let _ = ctx;
        0
    }
}
