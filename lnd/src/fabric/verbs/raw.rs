//! Owning wrappers around libibverbs objects.
//!
//! Each wrapper owns one object and destroys it in `Drop`, ignoring the return code (a destroy
//! that fails leaks the object; it never panics). Children keep their parents alive with an
//! `Arc`, so the destruction order verbs requires holds whatever order the owners drop in:
//! QP before its CQs and PD, MR before its PD, CQ before its completion channel, and all of
//! them before the device context is closed.
//!
//! The data-path verbs (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) are `static inline` in `verbs.h` and not exported by the library;
//! they are called, exactly as the header does, through the provider's function table
//! `(*context).ops`.
//!
//! # Thread safety
//! libibverbs and its providers are thread-safe: verbs on one object may be called from
//! several threads at once (providers lock their queues), which is what `Send`/`Sync` here
//! rely on. Object pointers are only dereferenced while the owning wrapper is alive.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::os::raw::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use ibverbs_sys as sys;

use crate::fabric::FabricError;

/// The calling thread's `errno` as an `io::Error`.
pub fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// The calling thread's `errno` (0 if none).
pub fn last_errno() -> i32 {
    last_error().raw_os_error().unwrap_or(0)
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL takes no pointer argument; an invalid fd yields -1 (EBADF), checked.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(last_error());
    }
    // SAFETY: F_SETFL with an int argument; failure is reported as -1 and checked.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(last_error());
    }
    Ok(())
}

/// The message for a failed `ibv_get_device_list`.
pub fn device_list_error(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => {
            "libibverbs found no devices (ENOSYS: the kernel has no RDMA support)".to_owned()
        }
        _ => format!("ibv_get_device_list failed: {e}"),
    }
}

/// The list of RDMA devices (`ibv_get_device_list`), freed on drop. Devices that were opened
/// stay valid after the list is freed (libibverbs reference-counts them).
pub struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    /// Lists the devices; a failure or an empty list is `NoDevice` with the cause.
    pub fn get() -> Result<DeviceList, FabricError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live int the call writes the count into; the result is checked.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(list) else {
            return Err(FabricError::NoDevice { reason: device_list_error(&last_error()) });
        };
        let dl = DeviceList { list, len: usize::try_from(n).unwrap_or(0) };
        if dl.len == 0 {
            return Err(FabricError::NoDevice {
                reason: "libibverbs found no devices (no RDMA NIC, or its kernel driver or provider library \
                         (ibverbs-providers) is missing)"
                    .to_owned(),
            });
        }
        Ok(dl)
    }

    fn device(&self, i: usize) -> Option<*mut sys::ibv_device> {
        if i >= self.len {
            return None;
        }
        // SAFETY: the list holds `len` valid device pointers (followed by NULL); `i < len`.
        let d = unsafe { *self.list.as_ptr().add(i) };
        (!d.is_null()).then_some(d)
    }

    /// How many devices there are.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the list is empty (never, for a list `get` returned).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The kernel name of device `i` (`mlx5_0`).
    pub fn name(&self, i: usize) -> String {
        let Some(d) = self.device(i) else { return String::new() };
        // SAFETY: `d` is a live device of this list; the name is a NUL-terminated string
        // inside the device struct, copied out before the list can be freed.
        let p = unsafe { sys::ibv_get_device_name(d) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated (see above), valid while the list lives.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Opens device `i`.
    pub fn open(&self, i: usize) -> io::Result<Context> {
        let d = self.device(i).ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))?;
        // SAFETY: `d` is a live device of this list.
        let ctx = unsafe { sys::ibv_open_device(d) };
        NonNull::new(ctx).map(|ptr| Context { ptr }).ok_or_else(last_error)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once, here.
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// An open device context (`ibv_context`), closed on drop.
pub struct Context {
    ptr: NonNull<sys::ibv_context>,
}

// SAFETY: an ibv_context may be used from any thread; libibverbs serialises what needs it.
unsafe impl Send for Context {}
// SAFETY: as above; shared use only makes verbs calls, which are thread-safe.
unsafe impl Sync for Context {}

impl Context {
    /// The raw pointer (valid while `self` lives).
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ptr.as_ptr()
    }

    /// The async-event fd.
    pub fn async_fd(&self) -> RawFd {
        // SAFETY: reading a plain field of the live context.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }

    /// Completion vectors the device offers.
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: reading a plain field of the live context.
        u32::try_from(unsafe { (*self.ptr.as_ptr()).num_comp_vectors }).unwrap_or(1).max(1)
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> io::Result<sys::ibv_device_attr> {
        let mut attr = sys::ibv_device_attr::default();
        // SAFETY: live context; `attr` is a live, writable ibv_device_attr.
        let rc = unsafe { sys::ibv_query_device(self.as_ptr(), &mut attr) };
        if rc != 0 { Err(io::Error::from_raw_os_error(rc.abs())) } else { Ok(attr) }
    }

    /// `ibv_query_port`. The exported symbol fills the older `_compat_ibv_port_attr` prefix
    /// of `ibv_port_attr` (everything up to `flags`); the rest stays zero.
    pub fn query_port(&self, port: u8) -> io::Result<sys::ibv_port_attr> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: live context; the library writes at most sizeof(_compat_ibv_port_attr)
        // bytes, a prefix of the larger, zeroed `ibv_port_attr` we pass (the layout
        // `verbs.h` itself relies on when it casts between the two).
        let rc = unsafe {
            sys::ibv_query_port(self.as_ptr(), port, (&mut attr as *mut sys::ibv_port_attr).cast())
        };
        if rc != 0 { Err(io::Error::from_raw_os_error(rc.abs())) } else { Ok(attr) }
    }

    /// `_ibv_query_gid_table`: every valid GID of every port with its type.
    pub fn query_gid_table(&self, max_entries: usize) -> io::Result<Vec<sys::ibv_gid_entry>> {
        let mut v = vec![sys::ibv_gid_entry::default(); max_entries.max(1)];
        // SAFETY: live context; `v` has room for `v.len()` entries of the size we pass.
        let n = unsafe {
            sys::_ibv_query_gid_table(
                self.as_ptr(),
                v.as_mut_ptr(),
                v.len(),
                0,
                std::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        let n =
            usize::try_from(n).map_err(|_| io::Error::from_raw_os_error(i32::try_from(-n).unwrap_or(0)))?;
        v.truncate(n);
        Ok(v)
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: u32) -> io::Result<[u8; 16]> {
        let mut gid = sys::ibv_gid::default();
        let index = c_int::try_from(index).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: live context; `gid` is a live, writable ibv_gid.
        let rc = unsafe { sys::ibv_query_gid(self.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(last_error());
        }
        // SAFETY: `raw` is the byte view of the 16-byte union; every bit pattern is valid.
        Ok(unsafe { gid.raw })
    }

    /// Takes the next async event, if any (the fd must be non-blocking), and acknowledges it
    /// after `f` has looked at it (the element pointers are valid until the ack).
    pub fn next_async_event<R>(&self, f: impl FnOnce(&sys::ibv_async_event) -> R) -> Option<R> {
        let mut ev = sys::ibv_async_event::default();
        // SAFETY: live context; `ev` is a live, writable event struct.
        if unsafe { sys::ibv_get_async_event(self.as_ptr(), &mut ev) } != 0 {
            return None; // EAGAIN (nothing pending) or an error: nothing to acknowledge
        }
        let r = f(&ev);
        // SAFETY: `ev` was returned by ibv_get_async_event and is acknowledged exactly once.
        unsafe { sys::ibv_ack_async_event(&mut ev) };
        Some(r)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child object holds an Arc<Context>, so none is alive now; the context
        // is closed once.
        unsafe { sys::ibv_close_device(self.ptr.as_ptr()) };
    }
}

/// A protection domain, deallocated on drop.
pub struct RawPd {
    ptr: NonNull<sys::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: see the module docs (thread-safe verbs; pointer owned by this wrapper).
unsafe impl Send for RawPd {}
// SAFETY: see the module docs.
unsafe impl Sync for RawPd {}

impl RawPd {
    /// `ibv_alloc_pd`.
    pub fn alloc(ctx: &Arc<Context>) -> io::Result<RawPd> {
        // SAFETY: live context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) };
        NonNull::new(pd).map(|ptr| RawPd { ptr, ctx: ctx.clone() }).ok_or_else(last_error)
    }

    /// The raw pointer.
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.ptr.as_ptr()
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The kernel handle.
    pub fn handle(&self) -> u32 {
        // SAFETY: reading a plain field of the live PD.
        unsafe { (*self.ptr.as_ptr()).handle }
    }
}

impl Drop for RawPd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs of this PD hold an Arc<RawPd>, so none is alive; freed once.
        unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A memory registration, deregistered on drop.
pub struct RawMr {
    ptr: NonNull<sys::ibv_mr>,
    _pd: Arc<RawPd>,
}

// SAFETY: see the module docs.
unsafe impl Send for RawMr {}
// SAFETY: see the module docs.
unsafe impl Sync for RawMr {}

impl RawMr {
    /// `ibv_reg_mr`.
    ///
    /// # Safety
    /// `addr..addr+len` must stay valid for the device to read and write until the returned
    /// region is dropped (the contract of [`crate::fabric::Device::reg_mr`]).
    pub unsafe fn register(pd: &Arc<RawPd>, addr: *mut u8, len: usize, access: u32) -> Result<RawMr, i32> {
        let access = c_int::try_from(access).map_err(|_| libc::EINVAL)?;
        // SAFETY: live PD; the memory contract is the caller's (see above).
        let mr = unsafe { sys::ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access) };
        NonNull::new(mr).map(|ptr| RawMr { ptr, _pd: pd.clone() }).ok_or_else(last_errno)
    }

    /// `(lkey, rkey)`.
    pub fn keys(&self) -> (u32, u32) {
        // SAFETY: reading plain fields of the live MR.
        unsafe { ((*self.ptr.as_ptr()).lkey, (*self.ptr.as_ptr()).rkey) }
    }
}

impl Drop for RawMr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once.
        unsafe { sys::ibv_dereg_mr(self.ptr.as_ptr()) };
    }
}

/// A completion channel (non-blocking fd), destroyed on drop.
pub struct RawChannel {
    ptr: NonNull<sys::ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: see the module docs.
unsafe impl Send for RawChannel {}
// SAFETY: see the module docs.
unsafe impl Sync for RawChannel {}

impl RawChannel {
    /// `ibv_create_comp_channel`, with its fd set `O_NONBLOCK`.
    pub fn create(ctx: &Arc<Context>) -> io::Result<RawChannel> {
        // SAFETY: live context.
        let ch = unsafe { sys::ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).map(|ptr| RawChannel { ptr, _ctx: ctx.clone() }).ok_or_else(last_error)?;
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    /// The fd.
    pub fn fd(&self) -> RawFd {
        // SAFETY: reading a plain field of the live channel.
        unsafe { (*self.ptr.as_ptr()).fd }
    }
}

impl Drop for RawChannel {
    fn drop(&mut self) {
        // SAFETY: the only CQ on this channel is destroyed before (RawCq drops its channel
        // after destroying itself); destroyed once.
        unsafe { sys::ibv_destroy_comp_channel(self.ptr.as_ptr()) };
    }
}

/// A completion queue with its own completion channel, destroyed on drop.
pub struct RawCq {
    ptr: NonNull<sys::ibv_cq>,
    // Dropped after the CQ is destroyed in `Drop::drop`.
    channel: RawChannel,
    ctx: Arc<Context>,
}

// SAFETY: see the module docs (providers lock the CQ in poll_cq).
unsafe impl Send for RawCq {}
// SAFETY: see the module docs.
unsafe impl Sync for RawCq {}

impl RawCq {
    /// `ibv_create_cq` on a fresh completion channel; `cq_context` is the CQ's identifier
    /// (reported back in CQ async events).
    pub fn create(ctx: &Arc<Context>, cqe: u32, id: u32, comp_vector: u32) -> Result<RawCq, FabricError> {
        let channel = RawChannel::create(ctx).map_err(|e| FabricError::io("ibv_create_comp_channel", e))?;
        let cqe = c_int::try_from(cqe).unwrap_or(c_int::MAX);
        let vector = c_int::try_from(comp_vector).unwrap_or(0);
        // The identifier travels as the pointer-sized cq_context and is never dereferenced.
        let cq_context = id as usize as *mut std::ffi::c_void;
        // SAFETY: live context and channel; the CQ's context pointer is an opaque integer.
        let cq = unsafe { sys::ibv_create_cq(ctx.as_ptr(), cqe, cq_context, channel.ptr.as_ptr(), vector) };
        match NonNull::new(cq) {
            Some(ptr) => Ok(RawCq { ptr, channel, ctx: ctx.clone() }),
            None => Err(super::map::create_cq_error(last_errno())),
        }
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw pointer.
    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.ptr.as_ptr()
    }

    /// The actual number of entries.
    pub fn cqe(&self) -> u32 {
        // SAFETY: reading a plain field of the live CQ.
        u32::try_from(unsafe { (*self.ptr.as_ptr()).cqe }).unwrap_or(0)
    }

    /// The completion channel's fd.
    pub fn channel_fd(&self) -> RawFd {
        self.channel.fd()
    }

    /// `ibv_poll_cq` through the ops table: fills `wc` from the front, returns how many
    /// (a negative provider error reads as 0).
    pub fn poll(&self, wc: &mut [sys::ibv_wc]) -> usize {
        let n = c_int::try_from(wc.len()).unwrap_or(c_int::MAX);
        // SAFETY: live CQ of a live context; `ops` is the provider's table, filled at open.
        let Some(poll_cq) = (unsafe { (*self.ctx.as_ptr()).ops.poll_cq }) else { return 0 };
        // SAFETY: live CQ; `wc` has room for `n` completions (the crate's ibv_wc has the C
        // layout, checked by its layout test).
        let got = unsafe { poll_cq(self.as_ptr(), n, wc.as_mut_ptr()) };
        usize::try_from(got).unwrap_or(0)
    }

    /// `ibv_req_notify_cq` through the ops table: 0 or an errno.
    pub fn req_notify(&self, solicited_only: bool) -> i32 {
        // SAFETY: live context; see `poll`.
        let Some(req) = (unsafe { (*self.ctx.as_ptr()).ops.req_notify_cq }) else { return libc::ENOSYS };
        // SAFETY: live CQ.
        unsafe { req(self.as_ptr(), c_int::from(solicited_only)) }
    }

    /// `ibv_get_cq_event` (non-blocking) + `ibv_ack_cq_events`: true if a notification was
    /// consumed.
    pub fn get_event(&self) -> bool {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: live channel; the out-pointers are live locals. With O_NONBLOCK the call
        // returns -1 (EAGAIN) instead of waiting.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel.ptr.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 || cq.is_null() {
            return false;
        }
        // SAFETY: `cq` is the CQ the event was for: this one, the only CQ on its channel,
        // alive while `self` is. Every event is acknowledged once, so destroy never waits.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        true
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: QPs using this CQ hold an Arc<RawCq>, so none is alive; every event was
        // acknowledged in `get_event`; destroyed once, before its channel (field drop).
        unsafe { sys::ibv_destroy_cq(self.ptr.as_ptr()) };
    }
}

/// An RC queue pair, destroyed on drop.
pub struct RawQp {
    ptr: NonNull<sys::ibv_qp>,
    pd: Arc<RawPd>,
    _send_cq: Arc<RawCq>,
    _recv_cq: Arc<RawCq>,
}

// SAFETY: see the module docs (providers lock the send and receive queues).
unsafe impl Send for RawQp {}
// SAFETY: see the module docs.
unsafe impl Sync for RawQp {}

impl RawQp {
    /// `ibv_create_qp` (RC). On success `init.cap` holds the actual capacities; on failure
    /// the errno.
    pub fn create(
        pd: &Arc<RawPd>,
        send_cq: &Arc<RawCq>,
        recv_cq: &Arc<RawCq>,
        cap: sys::ibv_qp_cap,
        sq_sig_all: bool,
    ) -> Result<(RawQp, sys::ibv_qp_cap), i32> {
        let mut init = sys::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: send_cq.as_ptr(),
            recv_cq: recv_cq.as_ptr(),
            srq: std::ptr::null_mut(),
            cap,
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: c_int::from(sq_sig_all),
        };
        // SAFETY: live PD and CQs of the same context (checked by the caller); `init` is a
        // live, writable init attr the provider updates with the actual caps.
        let qp = unsafe { sys::ibv_create_qp(pd.as_ptr(), &mut init) };
        match NonNull::new(qp) {
            Some(ptr) => Ok((
                RawQp { ptr, pd: pd.clone(), _send_cq: send_cq.clone(), _recv_cq: recv_cq.clone() },
                init.cap,
            )),
            None => Err(last_errno()),
        }
    }

    /// The raw pointer.
    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.ptr.as_ptr()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: reading a plain field of the live QP.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// `ibv_query_qp` for the current state.
    pub fn query_state(&self) -> io::Result<sys::ibv_qp_state::Type> {
        let mut attr = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        let mask = sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int;
        // SAFETY: live QP; both out-structs are live and writable.
        let rc = unsafe { sys::ibv_query_qp(self.as_ptr(), &mut attr, mask, &mut init) };
        if rc != 0 { Err(io::Error::from_raw_os_error(rc.abs())) } else { Ok(attr.qp_state) }
    }

    /// `ibv_modify_qp`: 0 or an errno.
    pub fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: sys::ibv_qp_attr_mask) -> i32 {
        let mask = c_int::try_from(mask.0).unwrap_or(0);
        // SAFETY: live QP; `attr` is a fully initialised attr struct the call only reads.
        unsafe { sys::ibv_modify_qp(self.as_ptr(), attr, mask) }
    }

    /// `ibv_post_send` through the ops table: 0 or an errno, with `bad` set to the first
    /// WR not posted.
    ///
    /// # Safety
    /// `wr` must head a valid `next`-linked chain of send WRs whose SGE lists are valid for
    /// the duration of the call.
    pub unsafe fn post_send(&self, wr: *mut sys::ibv_send_wr, bad: &mut *mut sys::ibv_send_wr) -> i32 {
        // SAFETY: live QP of a live context (the PD keeps it); the table is the provider's.
        let Some(post) = (unsafe { (*self.pd.context().as_ptr()).ops.post_send }) else {
            return libc::ENOSYS;
        };
        // SAFETY: the chain's validity is the caller's promise; the QP is live.
        unsafe { post(self.as_ptr(), wr, bad) }
    }

    /// `ibv_post_recv` through the ops table: 0 or an errno, with `bad` set to the first WR
    /// not posted.
    ///
    /// # Safety
    /// As for [`RawQp::post_send`], with receive WRs.
    pub unsafe fn post_recv(&self, wr: *mut sys::ibv_recv_wr, bad: &mut *mut sys::ibv_recv_wr) -> i32 {
        // SAFETY: as in `post_send`.
        let Some(post) = (unsafe { (*self.pd.context().as_ptr()).ops.post_recv }) else {
            return libc::ENOSYS;
        };
        // SAFETY: the chain's validity is the caller's promise; the QP is live.
        unsafe { post(self.as_ptr(), wr, bad) }
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once, before the CQs and PD it holds
        // (they are fields, dropped after this body). Async events are acknowledged as
        // they are read, so destroy does not wait on them.
        unsafe { sys::ibv_destroy_qp(self.ptr.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enosys_is_explained() {
        let msg = device_list_error(&io::Error::from_raw_os_error(libc::ENOSYS));
        assert_eq!(msg, "libibverbs found no devices (ENOSYS: the kernel has no RDMA support)");
        assert!(
            device_list_error(&io::Error::from_raw_os_error(libc::EACCES))
                .starts_with("ibv_get_device_list failed")
        );
    }

    #[test]
    fn nonblocking_is_set() {
        let mut fds = [0 as c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        set_nonblocking(fds[0]).unwrap();
        // SAFETY: F_GETFL on a pipe end we own.
        let flags = unsafe { libc::fcntl(fds[0], libc::F_GETFL) };
        assert_ne!(flags & libc::O_NONBLOCK, 0);
        for fd in fds {
            // SAFETY: closes the pipe ends this test owns, once.
            unsafe { libc::close(fd) };
        }
        assert!(set_nonblocking(-1).is_err());
    }
}
