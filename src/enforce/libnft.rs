//! libnftables in process: the one place `enforce` calls C.
//!
//! What goes through it: a microVM tap's fence (applied and read back),
//! replacing a host table that exists already, removing a fence, reading the
//! drop counters, and the reference read-back tests compare host mode's
//! netlink table with (`nft::verify_with_libnftables`). Host mode's table
//! at a sandbox's start does not: `netlink` sends and reads it itself, as
//! libnftables cost about 1.8 ms of that start (docs/measurements.md, "round
//! nine"). Why libnftables for the rest, and not more of our own netlink:
//! the fences are larger (layer 2, ARP, ICMPv6, per-reason counters) and
//! libnftables is the parser and compiler that `nft -j -f -` itself runs,
//! so what is applied, and what the read-back compares, is exactly what the
//! golden files say, in the same whole-or-nothing batch. In process the
//! library is loaded once (about 1 ms) and a context costs about 0.3 ms.
//!
//! It is loaded with dlopen at first use rather than linked: building needs
//! no -dev package, and a machine without nftables gets a clear error
//! ("install nftables") instead of a binary that cannot start.
//!
//! libnftables keeps process-wide state (a one-time initialisation, and an
//! interface-name cache that rules naming `oif "lo"` fill from the calling
//! thread's namespace), so every use holds one process-wide lock: two
//! sandboxes never talk to it at once. A context's netlink socket belongs to
//! the namespace of the thread that opened it, so a context never leaves the
//! [`session`] that made it. This module must never let libnftables write to
//! sluice's stdout or stderr (output and errors are buffered and returned).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Mutex, OnceLock, PoisonError};

use super::EnforceError;

/// The libnftables1 ABI (soname 1), as Debian's libnftables1 ships it.
const LIBRARY: &str = "libnftables.so.1";
/// `NFT_CTX_DEFAULT`: a context with its own netlink socket.
const NFT_CTX_DEFAULT: u32 = 0;
/// `NFT_CTX_OUTPUT_JSON`: JSON listings, and JSON input tried first.
const NFT_CTX_OUTPUT_JSON: c_uint = 1 << 4;
/// `NFT_CTX_OUTPUT_NUMERIC_PROTO`: layer 4 protocols listed as numbers. By
/// name, each listing asks glibc's NSS (nsswitch.conf, a search for
/// libnss_db, /etc/protocols) on the path of every start; the ruleset says
/// them as numbers too (see `ruleset::meta_l4proto`).
const NFT_CTX_OUTPUT_NUMERIC_PROTO: c_uint = 1 << 7;

type Ctx = *mut c_void;

/// The entry points sluice uses, resolved once.
struct Api {
    ctx_new: unsafe extern "C" fn(u32) -> Ctx,
    ctx_free: unsafe extern "C" fn(Ctx),
    output_set_flags: unsafe extern "C" fn(Ctx, c_uint),
    buffer_output: unsafe extern "C" fn(Ctx) -> c_int,
    buffer_error: unsafe extern "C" fn(Ctx) -> c_int,
    run_cmd_from_buffer: unsafe extern "C" fn(Ctx, *const c_char) -> c_int,
    get_output_buffer: unsafe extern "C" fn(Ctx) -> *const c_char,
    get_error_buffer: unsafe extern "C" fn(Ctx) -> *const c_char,
    /// Kept (never closed) so that the pointers above stay valid.
    _library: libloading::Library,
}

/// What one command did: whether it succeeded, and what it printed.
#[derive(Debug)]
pub(super) struct Reply {
    pub ok: bool,
    pub output: String,
    pub error: String,
}

/// How a command's listing is printed: nft's JSON, or its text (for what
/// nft 1.0.6's JSON leaves out: the device a netdev chain is bound to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Output {
    Json,
    Text,
}

/// One command runner: takes a command (a JSON document, or nft's text
/// syntax) and how to print what it lists, returns its [`Reply`].
pub(super) type Run<'a> = dyn FnMut(Output, &CStr) -> Reply + 'a;

/// Opens a libnftables context in the CALLING THREAD's network namespace,
/// hands `work` a runner for commands on it (run in order, on one context,
/// so later commands see what earlier ones did: an apply and its read-back
/// share one session), and frees the context when `work` returns. `work`
/// runs on a thread of its own that sees no descriptor but 0-2, so it must
/// not use (or own) any.
pub(super) fn session<T: Send>(
    work: impl FnOnce(&mut Run<'_>) -> T + Send,
) -> Result<T, EnforceError> {
    // libnftables waits for netlink replies with select(2), which glibc
    // aborts the whole process over when the socket's number is 1024 or
    // more: a sandbox holding a thousand connections made the daemon's next
    // attach kill it. So the context lives on a thread of its own whose
    // descriptor table is a private copy with everything above stderr
    // closed, where its socket gets a low number. The thread starts in the
    // calling thread's network namespace, which is where the context must be.
    std::thread::scope(|scope| {
        match scope
            .spawn(move || {
                if !matches!(ffi(Call::PrivateDescriptors), Done::Unshared(true)) {
                    return Err(EnforceError::Descriptors(std::io::Error::last_os_error()));
                }
                session_here(work)
            })
            .join()
        {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// [`session`]'s work, on the thread made for it.
fn session_here<T>(work: impl FnOnce(&mut Run<'_>) -> T) -> Result<T, EnforceError> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let api = api()?;
    let _held = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
    // libnftables calls exit() when it cannot open its netlink socket; find
    // out first, and fail with an error instead.
    netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER)
        .map_err(EnforceError::Netlink)?;
    let ctx = match ffi(Call::Open(
        api,
        NFT_CTX_OUTPUT_JSON | NFT_CTX_OUTPUT_NUMERIC_PROTO,
    )) {
        Done::Opened(Some(ctx)) => ctx,
        _ => return Err(EnforceError::Context),
    };
    let mut now = Output::Json;
    let mut run = |output: Output, command: &CStr| {
        if output != now {
            let flags = match output {
                Output::Json => NFT_CTX_OUTPUT_JSON | NFT_CTX_OUTPUT_NUMERIC_PROTO,
                Output::Text => NFT_CTX_OUTPUT_NUMERIC_PROTO,
            };
            ffi(Call::SetOutput(&ctx, flags));
            now = output;
        }
        match ffi(Call::Run(&ctx, command)) {
            Done::Ran(reply) => reply,
            _ => unreachable!("a run answers with its reply"),
        }
    };
    Ok(work(&mut run))
}

/// The library, loaded once: `Err` says why it could not be.
static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api, EnforceError> {
    // A static-pie binary that dlopens libnftables gets a second, dynamic
    // libc beside its own, and crashes in it: refuse instead of loading.
    if cfg!(target_feature = "crt-static") {
        return Err(EnforceError::StaticBuild);
    }
    API.get_or_init(|| match ffi(Call::Load) {
        Done::Loaded(api) => api,
        _ => unreachable!("a load answers with the library"),
    })
    .as_ref()
    .map_err(|why| EnforceError::NftNotFound(why.clone()))
}

/// Load the library as every session does (once per process), without
/// opening a context: whether this machine can run a fence at all.
pub(super) fn load() -> Result<(), EnforceError> {
    api().map(|_| ())
}

/// One libnftables context, open: its own netlink socket, in the network
/// namespace of the thread that opened it (it is neither Send nor Sync, so
/// it stays there). Freed on drop.
struct Context {
    api: &'static Api,
    raw: std::ptr::NonNull<c_void>,
}

impl Drop for Context {
    fn drop(&mut self) {
        ffi(Call::Close(self));
    }
}

/// Every call into C, as data, so that one `unsafe` block ([`ffi`]) holds
/// them all.
enum Call<'a> {
    /// Give this thread a private descriptor table with only 0, 1 and 2.
    PrivateDescriptors,
    /// dlopen the library and resolve the entry points.
    Load,
    /// A new context with these output flags (JSON or text) and buffered
    /// output and errors.
    Open(&'static Api, c_uint),
    /// Print a context's listings with these output flags (JSON or text).
    SetOutput(&'a Context, c_uint),
    /// One command on a context, and what it printed.
    Run(&'a Context, &'a CStr),
    /// Free a context (only from its `Drop`: nothing uses it afterwards).
    Close(&'a mut Context),
}

/// What a [`Call`] answers.
enum Done {
    Unshared(bool),
    Loaded(Result<Api, String>),
    Opened(Option<Context>),
    Ran(Reply),
    Set,
    Closed,
}

fn ffi(call: Call<'_>) -> Done {
    // SAFETY: LIBRARY is the system's nftables library; loading it runs
    // only its own ELF initialisers. Each symbol is read as the function
    // type <nftables/libnftables.h> declares for it in the soname-1 ABI, and
    // the Library is stored in the Api next to the pointers and never
    // closed (the Api lives in a static), so they never outlive it. A
    // `Context` is made only here, from a non-null nft_ctx_new, used only
    // through `&Context` on the thread that made it (session holds
    // ONE_AT_A_TIME meanwhile), and freed exactly once, by its Drop. Each
    // command is a NUL-terminated C string that outlives its call. The
    // buffers nft_ctx_get_*_buffer return are NUL-terminated strings owned
    // by the context, valid until its next call; they are copied at once.
    //
    // close_range with CLOSE_RANGE_UNSHARE first gives the calling thread a
    // private copy of the descriptor table and closes only that copy's
    // descriptors above 2: the process's own table, and every descriptor
    // another thread uses, are untouched. It is called only first thing on
    // a thread made for one session, whose work owns no descriptors, so
    // nothing on that thread refers to what it closes.
    unsafe {
        match call {
            Call::PrivateDescriptors => Done::Unshared(
                libc::close_range(3, c_uint::MAX, libc::CLOSE_RANGE_UNSHARE as c_int) == 0,
            ),
            Call::Load => {
                let load = || -> Result<Api, String> {
                    let library = libloading::Library::new(LIBRARY).map_err(|e| e.to_string())?;
                    macro_rules! symbol {
                        ($name:literal) => {
                            *library
                                .get(concat!($name, "\0").as_bytes())
                                .map_err(|e| format!("{LIBRARY} has no {}: {e}", $name))?
                        };
                    }
                    Ok(Api {
                        ctx_new: symbol!("nft_ctx_new"),
                        ctx_free: symbol!("nft_ctx_free"),
                        output_set_flags: symbol!("nft_ctx_output_set_flags"),
                        buffer_output: symbol!("nft_ctx_buffer_output"),
                        buffer_error: symbol!("nft_ctx_buffer_error"),
                        run_cmd_from_buffer: symbol!("nft_run_cmd_from_buffer"),
                        get_output_buffer: symbol!("nft_ctx_get_output_buffer"),
                        get_error_buffer: symbol!("nft_ctx_get_error_buffer"),
                        _library: library,
                    })
                };
                Done::Loaded(load())
            }
            Call::Open(api, output_flags) => {
                let Some(raw) = std::ptr::NonNull::new((api.ctx_new)(NFT_CTX_DEFAULT)) else {
                    return Done::Opened(None);
                };
                let ctx = Context { api, raw };
                (api.output_set_flags)(raw.as_ptr(), output_flags);
                // Unbuffered, libnftables would print to sluice's own stdio.
                let buffered =
                    (api.buffer_output)(raw.as_ptr()) == 0 && (api.buffer_error)(raw.as_ptr()) == 0;
                // Not buffered: dropped, so freed.
                Done::Opened(buffered.then_some(ctx))
            }
            Call::SetOutput(ctx, output_flags) => {
                (ctx.api.output_set_flags)(ctx.raw.as_ptr(), output_flags);
                Done::Set
            }
            Call::Run(ctx, command) => {
                let (api, raw) = (ctx.api, ctx.raw.as_ptr());
                let text = |p: *const c_char| {
                    if p.is_null() {
                        String::new()
                    } else {
                        CStr::from_ptr(p).to_string_lossy().into_owned()
                    }
                };
                let rc = (api.run_cmd_from_buffer)(raw, command.as_ptr());
                Done::Ran(Reply {
                    ok: rc == 0,
                    output: text((api.get_output_buffer)(raw)),
                    error: text((api.get_error_buffer)(raw)).trim().to_string(),
                })
            }
            Call::Close(ctx) => {
                (ctx.api.ctx_free)(ctx.raw.as_ptr());
                Done::Closed
            }
        }
    }
}
