//! IP addressing on top of the IB CM, as Linux rdma_cm lays it out (IBTA Annex A11, "IP CM").
//!
//! rdma_cm names a listener by IP port: the REQ's Service ID is `(port_space << 16) | port`
//! ([`ip_service_id`]; Lustre's TCP port 987 gives `0x0000_0000_0106_03DB`), and the first 36
//! bytes of the REQ's private data are a `cma_hdr` ([`CmaHeader`]) carrying the source port
//! and both IP addresses. The consumer's own data (o2iblnd's CONNREQ) follows at offset 36,
//! at most 56 bytes, zero filled ([`req_private_data`], [`split_req_private_data`]). The
//! destination port is not in the header: it is the low 16 bits of the Service ID. REP, REJ,
//! RTU, DREQ and DREP private data carry no header and pass through unchanged.
//!
//! # Contract
//! * **No panics**: every function returns a value or a typed [`MadError`].
//! * **Bit-exact**: byte 0 is the header version (0), byte 1 the IP version in its top nibble
//!   (0x40), bytes 2–3 the source port big-endian, bytes 4–19 and 20–35 the source and
//!   destination addresses with IPv4 in the last 4 bytes and the first 12 zero (not
//!   `::ffff`-mapped, unlike GIDs).
//! * **IPv4 only**: a header announcing IPv6 decodes to [`MadError::CmaIpv6`]; any other IP
//!   version to [`MadError::CmaIpVersion`]; a nonzero header version to
//!   [`MadError::CmaVersion`]. As in Linux, the low nibble of byte 1 and the 12 padding bytes in
//!   front of each IPv4 address are ignored on receipt (and written as zero).
//! * What the passive side checks beyond parsing (the destination address matching a bound
//!   listener, the address family) belongs to the CM; Linux rejects such REQs with REJ 28
//!   and no data, and REQs for a Service ID nobody listens on with REJ 8.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::net::Ipv4Addr;

use super::mad::{MadError, REQ_PRIVATE_DATA_LEN, Rd, Wr};

/// Bytes in the IP CM header.
pub const CMA_HEADER_LEN: usize = 36;
/// Consumer private-data bytes left in a REQ after the IP CM header.
pub const REQ_CONSUMER_DATA_LEN: usize = REQ_PRIVATE_DATA_LEN - CMA_HEADER_LEN;
/// The IP CM header version Linux sends and accepts.
pub const CMA_VERSION: u8 = 0x00;

/// Mask of the fixed part of an IP CM Service ID: the 40 bits above the port space's low byte
/// and the port.
pub const IP_CM_SERVICE_ID_MASK: u64 = 0xFFFF_FFFF_FF00_0000;
/// The Annex A11 prefix of IP CM Service IDs (`0x0000_0000_01` followed by the low byte of
/// the port space and the port).
pub const IP_CM_SERVICE_ID_PREFIX: u64 = 0x0000_0000_0100_0000;

/// An rdma_cm port space (`enum rdma_ucm_port_space`): the upper half of a Service ID's low 32
/// bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` (0x0002). Its Service IDs lie outside the IP CM prefix.
    Ipoib,
    /// `RDMA_PS_TCP` (0x0106): reliable connections, what o2iblnd uses.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111).
    Udp,
    /// `RDMA_PS_IB` (0x013F).
    Ib,
}

impl PortSpace {
    /// The 16-bit code.
    pub const fn code(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013F,
        }
    }

    /// The port space of a code.
    pub const fn from_code(code: u16) -> Option<PortSpace> {
        match code {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013F => Some(PortSpace::Ib),
            _ => None,
        }
    }
}

/// The Service ID rdma_cm uses for `port` in `space`: `(space << 16) | port`
/// (`cma_get_service_id`). TCP port 987 → `0x0000_0000_0106_03DB`.
pub const fn ip_service_id(space: PortSpace, port: u16) -> u64 {
    ((space.code() as u64) << 16) | port as u64
}

/// The port space and port of an IP CM Service ID: `None` unless the Service ID starts with
/// the Annex A11 prefix `0x0000_0000_01` and names a known port space. IPoIB Service IDs
/// (`0x0000_0000_0002_pppp`) are outside that prefix and therefore give `None`, although
/// [`ip_service_id`] builds them.
pub const fn parse_ip_service_id(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id & IP_CM_SERVICE_ID_MASK != IP_CM_SERVICE_ID_PREFIX {
        return None;
    }
    match PortSpace::from_code((service_id >> 16) as u16) {
        Some(space) => Some((space, service_id as u16)),
        None => None,
    }
}

/// The IP CM header (`struct cma_hdr`) at the front of a REQ's private data, IPv4 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// The active side's source port (the destination port is in the Service ID).
    pub src_port: u16,
    /// The active side's address.
    pub src: Ipv4Addr,
    /// The address the active side connects to.
    pub dst: Ipv4Addr,
}

impl CmaHeader {
    /// The 36 bytes of the header: version 0, IP version 0x40, source port, source and
    /// destination IPv4 addresses in the last 4 bytes of their 16-byte fields.
    pub fn encode(&self) -> [u8; CMA_HEADER_LEN] {
        let mut out = [0u8; CMA_HEADER_LEN];
        let mut w = Wr(&mut out);
        w.u8(0, CMA_VERSION);
        w.u8(1, 4 << 4);
        w.u16(2, self.src_port);
        w.bytes(16, &self.src.octets());
        w.bytes(32, &self.dst.octets());
        out
    }

    /// Parses exactly 36 bytes. Checks the version (0) and the IP version nibble (4; 6 is
    /// [`MadError::CmaIpv6`]).
    pub fn decode(bytes: &[u8]) -> Result<CmaHeader, MadError> {
        if bytes.len() != CMA_HEADER_LEN {
            return Err(MadError::CmaHeaderLength(bytes.len()));
        }
        let r = Rd(bytes);
        let version = r.u8(0);
        if version != CMA_VERSION {
            return Err(MadError::CmaVersion(version));
        }
        match r.u8(1) >> 4 {
            4 => {}
            6 => return Err(MadError::CmaIpv6),
            other => return Err(MadError::CmaIpVersion(other)),
        }
        Ok(CmaHeader {
            src_port: r.u16(2),
            src: Ipv4Addr::from(r.array::<4>(16)),
            dst: Ipv4Addr::from(r.array::<4>(32)),
        })
    }
}

/// A REQ's 92 bytes of private data: the IP CM header, then `consumer` (at most 56 bytes),
/// then zeros.
pub fn req_private_data(hdr: &CmaHeader, consumer: &[u8]) -> Result<[u8; REQ_PRIVATE_DATA_LEN], MadError> {
    if consumer.len() > REQ_CONSUMER_DATA_LEN {
        return Err(MadError::ConsumerDataTooLong(consumer.len()));
    }
    let mut out = [0u8; REQ_PRIVATE_DATA_LEN];
    let mut w = Wr(&mut out);
    w.bytes(0, &hdr.encode());
    w.bytes(CMA_HEADER_LEN, consumer);
    Ok(out)
}

/// Splits a REQ's private data into the IP CM header and the 56 bytes of consumer data
/// (which carry their own length, if any).
pub fn split_req_private_data(
    pd: &[u8; REQ_PRIVATE_DATA_LEN],
) -> Result<(CmaHeader, &[u8; REQ_CONSUMER_DATA_LEN]), MadError> {
    // Neither conversion can fail (92 = 36 + 56); a failure would be reported as a
    // truncation rather than a panic all the same.
    let (head, tail) = pd.split_first_chunk::<CMA_HEADER_LEN>().ok_or(MadError::Truncated(pd.len()))?;
    let hdr = CmaHeader::decode(head)?;
    let consumer =
        <&[u8; REQ_CONSUMER_DATA_LEN]>::try_from(tail).map_err(|_| MadError::Truncated(pd.len()))?;
    Ok((hdr, consumer))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 2);
    const DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    #[test]
    fn service_ids() {
        assert_eq!(ip_service_id(PortSpace::Tcp, 987), 0x0000_0000_0106_03DB);
        assert_eq!(ip_service_id(PortSpace::Udp, 0), 0x0000_0000_0111_0000);
        assert_eq!(ip_service_id(PortSpace::Ib, u16::MAX), 0x0000_0000_013F_FFFF);
        assert_eq!(ip_service_id(PortSpace::Ipoib, 1), 0x0000_0000_0002_0001);
        for space in [PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib] {
            for port in [0, 1, 987, u16::MAX] {
                let sid = ip_service_id(space, port);
                assert_eq!(parse_ip_service_id(sid), Some((space, port)));
                assert_eq!(PortSpace::from_code(space.code()), Some(space));
            }
        }
        assert_eq!(PortSpace::from_code(PortSpace::Ipoib.code()), Some(PortSpace::Ipoib));
        assert_eq!(PortSpace::from_code(0x0107), None);
        // IPoIB Service IDs are outside the IP CM prefix.
        assert_eq!(parse_ip_service_id(ip_service_id(PortSpace::Ipoib, 987)), None);
        // Wrong prefix, unknown space.
        assert_eq!(parse_ip_service_id(0x0000_0001_0106_03DB), None);
        assert_eq!(parse_ip_service_id(0x1000_0000_0106_03DB), None);
        assert_eq!(parse_ip_service_id(0x0000_0000_0206_03DB), None);
        assert_eq!(parse_ip_service_id(0x0000_0000_0107_03DB), None);
        assert_eq!(parse_ip_service_id(0), None);
        assert_eq!(parse_ip_service_id(u64::MAX), None);
    }

    fn expected_header() -> [u8; 36] {
        let mut e = [0u8; 36];
        e[0] = 0x00; // cma version
        e[1] = 0x40; // IP version 4 in the top nibble
        e[2..4].copy_from_slice(&[0x03, 0xFF]); // source port 1023, big-endian
        // 4..16 zero, 16..20 source IPv4
        e[16..20].copy_from_slice(&[192, 168, 1, 2]);
        // 20..32 zero, 32..36 destination IPv4
        e[32..36].copy_from_slice(&[10, 0, 0, 1]);
        e
    }

    #[test]
    fn cma_header_layout() {
        let h = CmaHeader { src_port: 1023, src: SRC, dst: DST };
        assert_eq!(h.encode(), expected_header());
        assert_eq!(CmaHeader::decode(&expected_header()), Ok(h));
        let extreme = CmaHeader { src_port: u16::MAX, src: Ipv4Addr::BROADCAST, dst: Ipv4Addr::UNSPECIFIED };
        assert_eq!(CmaHeader::decode(&extreme.encode()), Ok(extreme));
    }

    #[test]
    fn cma_header_errors() {
        let good = expected_header();
        assert_eq!(CmaHeader::decode(&good[..35]), Err(MadError::CmaHeaderLength(35)));
        assert_eq!(CmaHeader::decode(&[]), Err(MadError::CmaHeaderLength(0)));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(CmaHeader::decode(&long), Err(MadError::CmaHeaderLength(37)));
        let mut b = good;
        b[0] = 0x10;
        assert_eq!(CmaHeader::decode(&b), Err(MadError::CmaVersion(0x10)));
        let mut b = good;
        b[1] = 0x60;
        assert_eq!(CmaHeader::decode(&b), Err(MadError::CmaIpv6));
        for v in [0x00u8, 0x50, 0xF0] {
            let mut b = good;
            b[1] = v;
            assert_eq!(CmaHeader::decode(&b), Err(MadError::CmaIpVersion(v >> 4)));
        }
        // As in Linux: the low nibble of byte 1 and the IPv4 padding are ignored.
        let mut b = good;
        b[1] = 0x4F;
        b[4] = 0xFF;
        b[31] = 0xFF;
        assert_eq!(CmaHeader::decode(&b), CmaHeader::decode(&good));
    }

    #[test]
    fn req_private_data_layout() {
        let h = CmaHeader { src_port: 1023, src: SRC, dst: DST };
        let consumer: Vec<u8> = (1..=56).collect();
        let pd = req_private_data(&h, &consumer).unwrap();
        assert_eq!(pd[..36], expected_header());
        assert_eq!(pd[36..], consumer[..]);
        let (h2, c2) = split_req_private_data(&pd).unwrap();
        assert_eq!(h2, h);
        assert_eq!(&c2[..], &consumer[..]);

        let pd = req_private_data(&h, &[0xAB; 5]).unwrap();
        assert_eq!(pd[36..41], [0xAB; 5]);
        assert!(pd[41..].iter().all(|&b| b == 0), "zero filled");
        let pd = req_private_data(&h, &[]).unwrap();
        assert!(pd[36..].iter().all(|&b| b == 0));

        assert_eq!(req_private_data(&h, &[0; 57]), Err(MadError::ConsumerDataTooLong(57)));
        assert_eq!(req_private_data(&h, &[0; 200]), Err(MadError::ConsumerDataTooLong(200)));
    }

    #[test]
    fn split_errors() {
        let h = CmaHeader { src_port: 1, src: SRC, dst: DST };
        let mut pd = req_private_data(&h, b"x").unwrap();
        pd[1] = 0x60;
        assert_eq!(split_req_private_data(&pd), Err(MadError::CmaIpv6));
        pd[1] = 0x40;
        pd[0] = 1;
        assert_eq!(split_req_private_data(&pd), Err(MadError::CmaVersion(1)));
        assert_eq!(split_req_private_data(&[0; 92]), Err(MadError::CmaIpVersion(0)));
    }
}
