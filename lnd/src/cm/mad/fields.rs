//! The enumerated fields of CM messages (transport service type, "message REJected",
//! "message MRAed", "failover accepted") and the REJ reason, with their codes; a code outside
//! an enum decodes to its own [`MadError`](super::MadError), while [`RejReason`] keeps unknown codes.
#![cfg_attr(
    not(test),
    deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::fmt;

/// REQ transport service type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TransportType {
    /// Reliable connected (code 0).
    #[default]
    Rc,
    /// Unreliable connected (code 1).
    Uc,
    /// Extended reliable connected (code 3, as Linux encodes XRC).
    Xrc,
}

impl TransportType {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            TransportType::Rc => 0,
            TransportType::Uc => 1,
            TransportType::Xrc => 3,
        }
    }

    /// The type of a code; `None` for 2 (RD, unsupported) and anything wider than 2 bits.
    pub const fn from_code(code: u8) -> Option<TransportType> {
        match code {
            0 => Some(TransportType::Rc),
            1 => Some(TransportType::Uc),
            3 => Some(TransportType::Xrc),
            _ => None,
        }
    }
}

/// Which message a REJ rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageRejected {
    /// A REQ (code 0).
    #[default]
    Req,
    /// A REP (code 1).
    Rep,
    /// Some other message (code 2).
    Other,
}

impl MessageRejected {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            MessageRejected::Req => 0,
            MessageRejected::Rep => 1,
            MessageRejected::Other => 2,
        }
    }

    /// The value of a code; `None` for 3 (reserved) and wider values.
    pub const fn from_code(code: u8) -> Option<MessageRejected> {
        match code {
            0 => Some(MessageRejected::Req),
            1 => Some(MessageRejected::Rep),
            2 => Some(MessageRejected::Other),
            _ => None,
        }
    }
}

/// Which message an MRA acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageMraed {
    /// A REQ (code 0).
    #[default]
    Req,
    /// A REP (code 1).
    Rep,
    /// A LAP (code 2).
    Lap,
}

impl MessageMraed {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            MessageMraed::Req => 0,
            MessageMraed::Rep => 1,
            MessageMraed::Lap => 2,
        }
    }

    /// The value of a code; `None` for 3 (reserved) and wider values.
    pub const fn from_code(code: u8) -> Option<MessageMraed> {
        match code {
            0 => Some(MessageMraed::Req),
            1 => Some(MessageMraed::Rep),
            2 => Some(MessageMraed::Lap),
            _ => None,
        }
    }
}

/// A REP's answer to the REQ's alternate path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailoverAccepted {
    /// Failover accepted (code 0; also what is sent when there is no alternate path).
    #[default]
    Accepted,
    /// Failover not supported (code 1).
    NotSupported,
    /// Failover rejected (code 2).
    Rejected,
}

impl FailoverAccepted {
    /// The 2-bit code.
    pub const fn code(self) -> u8 {
        match self {
            FailoverAccepted::Accepted => 0,
            FailoverAccepted::NotSupported => 1,
            FailoverAccepted::Rejected => 2,
        }
    }

    /// The value of a code; `None` for 3 (reserved) and wider values.
    pub const fn from_code(code: u8) -> Option<FailoverAccepted> {
        match code {
            0 => Some(FailoverAccepted::Accepted),
            1 => Some(FailoverAccepted::NotSupported),
            2 => Some(FailoverAccepted::Rejected),
            _ => None,
        }
    }
}

/// Why a REJ rejects (IBTA Vol. 1 "Reject Reason"; Linux `enum ib_cm_rej_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 2: no EE context available.
    NoEec,
    /// 3: no resources available.
    NoResources,
    /// 4: timeout (ARI = the sender's CA GUID).
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid service ID (no listener).
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection.
    StaleConn,
    /// 11: RDC does not exist.
    RdcNotExist,
    /// 12: primary remote port GID rejected (ARI = the rejecter's GID).
    InvalidGid,
    /// 13: primary remote port LID rejected.
    InvalidLid,
    /// 14: invalid primary SL.
    InvalidSl,
    /// 15: invalid primary traffic class.
    InvalidTrafficClass,
    /// 16: invalid primary hop limit.
    InvalidHopLimit,
    /// 17: invalid primary packet rate.
    InvalidPacketRate,
    /// 18: alternate remote port GID rejected.
    InvalidAltGid,
    /// 19: alternate remote port LID rejected.
    InvalidAltLid,
    /// 20: invalid alternate SL.
    InvalidAltSl,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate,
    /// 24: port and CM redirection.
    PortCmRedirect,
    /// 25: port redirection.
    PortRedirect,
    /// 26: invalid path MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: consumer reject (the only reason that carries consumer private data).
    ConsumerDefined,
    /// 29: invalid RNR NAK retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: invalid class version.
    InvalidClassVersion,
    /// 32: invalid primary flow label.
    InvalidFlowLabel,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel,
    /// 35: vendor option not supported.
    VendorOptionNotSupported,
    /// Any other code (0, 34, 36 and above): kept as received.
    Other(u16),
}

impl RejReason {
    /// The reason of a wire code.
    pub const fn from_u16(code: u16) -> RejReason {
        match code {
            1 => RejReason::NoQp,
            2 => RejReason::NoEec,
            3 => RejReason::NoResources,
            4 => RejReason::Timeout,
            5 => RejReason::Unsupported,
            6 => RejReason::InvalidCommId,
            7 => RejReason::InvalidCommInstance,
            8 => RejReason::InvalidServiceId,
            9 => RejReason::InvalidTransportType,
            10 => RejReason::StaleConn,
            11 => RejReason::RdcNotExist,
            12 => RejReason::InvalidGid,
            13 => RejReason::InvalidLid,
            14 => RejReason::InvalidSl,
            15 => RejReason::InvalidTrafficClass,
            16 => RejReason::InvalidHopLimit,
            17 => RejReason::InvalidPacketRate,
            18 => RejReason::InvalidAltGid,
            19 => RejReason::InvalidAltLid,
            20 => RejReason::InvalidAltSl,
            21 => RejReason::InvalidAltTrafficClass,
            22 => RejReason::InvalidAltHopLimit,
            23 => RejReason::InvalidAltPacketRate,
            24 => RejReason::PortCmRedirect,
            25 => RejReason::PortRedirect,
            26 => RejReason::InvalidMtu,
            27 => RejReason::InsufficientRespResources,
            28 => RejReason::ConsumerDefined,
            29 => RejReason::InvalidRnrRetry,
            30 => RejReason::DuplicateLocalCommId,
            31 => RejReason::InvalidClassVersion,
            32 => RejReason::InvalidFlowLabel,
            33 => RejReason::InvalidAltFlowLabel,
            35 => RejReason::VendorOptionNotSupported,
            other => RejReason::Other(other),
        }
    }

    /// The wire code. `Other(c)` gives `c` back even if `c` is a named reason's code.
    pub const fn to_u16(self) -> u16 {
        match self {
            RejReason::NoQp => 1,
            RejReason::NoEec => 2,
            RejReason::NoResources => 3,
            RejReason::Timeout => 4,
            RejReason::Unsupported => 5,
            RejReason::InvalidCommId => 6,
            RejReason::InvalidCommInstance => 7,
            RejReason::InvalidServiceId => 8,
            RejReason::InvalidTransportType => 9,
            RejReason::StaleConn => 10,
            RejReason::RdcNotExist => 11,
            RejReason::InvalidGid => 12,
            RejReason::InvalidLid => 13,
            RejReason::InvalidSl => 14,
            RejReason::InvalidTrafficClass => 15,
            RejReason::InvalidHopLimit => 16,
            RejReason::InvalidPacketRate => 17,
            RejReason::InvalidAltGid => 18,
            RejReason::InvalidAltLid => 19,
            RejReason::InvalidAltSl => 20,
            RejReason::InvalidAltTrafficClass => 21,
            RejReason::InvalidAltHopLimit => 22,
            RejReason::InvalidAltPacketRate => 23,
            RejReason::PortCmRedirect => 24,
            RejReason::PortRedirect => 25,
            RejReason::InvalidMtu => 26,
            RejReason::InsufficientRespResources => 27,
            RejReason::ConsumerDefined => 28,
            RejReason::InvalidRnrRetry => 29,
            RejReason::DuplicateLocalCommId => 30,
            RejReason::InvalidClassVersion => 31,
            RejReason::InvalidFlowLabel => 32,
            RejReason::InvalidAltFlowLabel => 33,
            RejReason::VendorOptionNotSupported => 35,
            RejReason::Other(code) => code,
        }
    }

    /// The IBTA wording of the reason; `None` for [`RejReason::Other`].
    pub const fn ibta_name(self) -> Option<&'static str> {
        Some(match self {
            RejReason::NoQp => "No QP available",
            RejReason::NoEec => "No EEC available",
            RejReason::NoResources => "No resources available",
            RejReason::Timeout => "Timeout",
            RejReason::Unsupported => "Unsupported request",
            RejReason::InvalidCommId => "Invalid Communication ID",
            RejReason::InvalidCommInstance => "Invalid Communication Instance",
            RejReason::InvalidServiceId => "Invalid Service ID",
            RejReason::InvalidTransportType => "Invalid Transport Service Type",
            RejReason::StaleConn => "Stale connection",
            RejReason::RdcNotExist => "RDC does not exist",
            RejReason::InvalidGid => "Primary Remote Port GID rejected",
            RejReason::InvalidLid => "Primary Remote Port LID rejected",
            RejReason::InvalidSl => "Invalid Primary SL",
            RejReason::InvalidTrafficClass => "Invalid Primary Traffic Class",
            RejReason::InvalidHopLimit => "Invalid Primary Hop Limit",
            RejReason::InvalidPacketRate => "Invalid Primary Packet Rate",
            RejReason::InvalidAltGid => "Alternate Remote Port GID rejected",
            RejReason::InvalidAltLid => "Alternate Remote Port LID rejected",
            RejReason::InvalidAltSl => "Invalid Alternate SL",
            RejReason::InvalidAltTrafficClass => "Invalid Alternate Traffic Class",
            RejReason::InvalidAltHopLimit => "Invalid Alternate Hop Limit",
            RejReason::InvalidAltPacketRate => "Invalid Alternate Packet Rate",
            RejReason::PortCmRedirect => "Port and CM Redirection",
            RejReason::PortRedirect => "Port Redirection",
            RejReason::InvalidMtu => "Invalid Path MTU",
            RejReason::InsufficientRespResources => "Insufficient Responder Resources",
            RejReason::ConsumerDefined => "Consumer Reject",
            RejReason::InvalidRnrRetry => "Invalid RNR NAK Retry Count",
            RejReason::DuplicateLocalCommId => "Duplicate Local Communication ID",
            RejReason::InvalidClassVersion => "Invalid Class Version",
            RejReason::InvalidFlowLabel => "Invalid Primary Flow Label",
            RejReason::InvalidAltFlowLabel => "Invalid Alternate Flow Label",
            RejReason::VendorOptionNotSupported => "Vendor Option Not Supported",
            RejReason::Other(_) => return None,
        })
    }
}

impl From<u16> for RejReason {
    fn from(code: u16) -> RejReason {
        RejReason::from_u16(code)
    }
}

impl From<RejReason> for u16 {
    fn from(r: RejReason) -> u16 {
        r.to_u16()
    }
}

impl fmt::Display for RejReason {
    /// The IBTA wording and the code, e.g. `Consumer Reject (28)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ibta_name() {
            Some(name) => write!(f, "{name} ({})", self.to_u16()),
            None => write!(f, "Unknown reject reason ({})", self.to_u16()),
        }
    }
}
