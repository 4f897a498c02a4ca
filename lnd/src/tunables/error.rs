//! Tunables errors, warnings and source locations.
//!
//! Every error names where it happened (`file:line`) and, when a parameter is involved, the
//! `key=value` as written, so the message alone is enough to fix the file:
//!
//! ```text
//! /etc/modprobe.d/ko2iblnd.conf:3: peer_credit=32: unknown ko2iblnd parameter 'peer_credit' (did you mean 'peer_credits'?)
//! ```

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Where a setting, warning or error comes from.
///
/// `line` is the physical line holding the offending text (the `key=value` token, the quote, the
/// backslash...). When a directive is continued over several lines with `\`, `start_line` is the
/// line where the directive starts; otherwise both are equal. Lines count from 1; line 0 means
/// "not from a file" (a [`Tunables`](super::Tunables) built in code and checked with
/// [`finalize`](super::Tunables::finalize)), and `source` is then `<tunables>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// The source name given to the parser: the file path for [`load`](super::Tunables::load).
    pub source: String,
    /// The 1-based physical line of the offending text (0: not from a file).
    pub line: usize,
    /// The 1-based physical line where the (possibly continued) directive starts.
    pub start_line: usize,
}

impl Location {
    /// The source name used for values that were set in code, not read from a file.
    pub const PROGRAM: &'static str = "<tunables>";

    /// A location in `source` at physical `line`, in a directive starting at `start_line`.
    pub fn new(source: impl Into<String>, line: usize, start_line: usize) -> Location {
        Location { source: source.into(), line, start_line }
    }

    /// The location of values set in code ([`Location::PROGRAM`], line 0).
    pub fn program() -> Location {
        Location::new(Location::PROGRAM, 0, 0)
    }

    /// Whether the offending text sits on a continuation line (not the directive's first line).
    pub fn is_continuation(&self) -> bool {
        self.line != 0 && self.start_line != self.line
    }

    /// `" (in the directive starting at line N)"` for continuation lines, else empty; appended
    /// to messages so `file:line:` stays the physical line editors jump to.
    fn continuation_note(&self) -> String {
        if self.is_continuation() {
            format!(" (in the directive starting at line {})", self.start_line)
        } else {
            String::new()
        }
    }
}

impl fmt::Display for Location {
    /// `source:line`, or just `source` for line 0.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 { f.write_str(&self.source) } else { write!(f, "{}:{}", self.source, self.line) }
    }
}

/// What a [`Warning`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WarningKind {
    /// A value was raised or lowered into the range o2iblnd accepts, as o2iblnd does.
    Clamped,
    /// An obsolete parameter was accepted and has no effect (or is forced to its only value).
    Obsolete,
    /// A directive or another module's options were skipped (`install`, `alias`,
    /// `options ksocklnd ...`): a real modprobe.d file has them, this implementation loads no
    /// kernel module.
    Ignored,
    /// A parameter was set more than once; the last value wins, as with modprobe.
    Overridden,
    /// The value is accepted but o2iblnd would log a warning about it (e.g. `concurrent_sends`
    /// below `peer_credits`).
    Advisory,
}

/// A note about the configuration that does not stop it from being used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// Where the setting came from (`None` for values set in code).
    pub at: Option<Location>,
    /// What the warning is about.
    pub kind: WarningKind,
    /// The text, e.g. `peer_credits_hiw=2 raised to 4 (peer_credits/2)`.
    pub message: String,
}

impl Warning {
    pub(crate) fn new(at: Option<Location>, kind: WarningKind, message: impl Into<String>) -> Self {
        Warning { at, kind, message: message.into() }
    }
}

impl fmt::Display for Warning {
    /// `file:line: message`, or `message` for values set in code.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.at {
            Some(at) if at.line != 0 => write!(f, "{at}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Why a ko2iblnd configuration was refused. Nothing may start on a refused configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TunablesError {
    /// The parameter name is not a ko2iblnd parameter (current or obsolete).
    #[error(
        "{at}: {}: unknown ko2iblnd parameter '{}'{}{}",
        kv(.key, .value),
        shown(.key),
        did_you_mean(.suggestion),
        .at.continuation_note()
    )]
    UnknownParameter {
        /// Where.
        at: Location,
        /// The name as written (dashes already turned into underscores, as the kernel does).
        key: String,
        /// The value as written, if any.
        value: Option<String>,
        /// The closest valid name by edit distance, when reasonably close.
        suggestion: Option<&'static str>,
    },
    /// An integer parameter's value is not an integer (the kernel's `kstrtoint` syntax: decimal,
    /// `0x` hexadecimal or leading-`0` octal, optional sign).
    #[error("{at}: {}={}: not an integer{}", shown(.key), shown(.value), .at.continuation_note())]
    InvalidInteger {
        /// Where.
        at: Location,
        /// The parameter.
        key: String,
        /// The value as written.
        value: String,
    },
    /// A boolean parameter's value is not a boolean (`0`/`1`, any integer, `y`/`n`, `yes`/`no`,
    /// `true`/`false`, `on`/`off`).
    #[error(
        "{at}: {}={}: not a boolean (use 1 or 0){}",
        shown(.key),
        shown(.value),
        .at.continuation_note()
    )]
    InvalidBool {
        /// Where.
        at: Location,
        /// The parameter.
        key: String,
        /// The value as written.
        value: String,
    },
    /// A string parameter's value is not acceptable (e.g. `ipif_name` is not an interface name).
    #[error("{at}: {}={}: {reason}{}", shown(.key), shown(.value), .at.continuation_note())]
    InvalidString {
        /// Where.
        at: Location,
        /// The parameter.
        key: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A parameter that needs a value was written without one (`peer_credits`, `peer_credits=`,
    /// or `peer_credits = 32` with spaces).
    #[error(
        "{at}: {}: missing value (write {key}=VALUE, without spaces around '='){}",
        shown(.key),
        .at.continuation_note()
    )]
    MissingValue {
        /// Where.
        at: Location,
        /// The parameter.
        key: String,
    },
    /// The value is outside the range o2iblnd accepts, and o2iblnd refuses it (rather than
    /// clamping it), or it does not fit the kernel parameter's C type.
    #[error(
        "{at}: {key}={}: out of range (allowed: {allowed}){}",
        shown(.value),
        .at.continuation_note()
    )]
    OutOfRange {
        /// Where.
        at: Location,
        /// The parameter.
        key: String,
        /// The value as written.
        value: String,
        /// The accepted values.
        allowed: &'static str,
    },
    /// Two parameters contradict each other in a way o2iblnd refuses at startup
    /// (`fmr_pool_size` below `ntx / 4`).
    #[error("{at}: {key}={value}: {reason}{}", .at.continuation_note())]
    Inconsistent {
        /// Where the parameter named in `key` was set.
        at: Location,
        /// The parameter.
        key: String,
        /// Its value as written.
        value: String,
        /// The rule that is broken, with the other parameter's value.
        reason: String,
    },
    /// A `"` or `'` quote is not closed before the end of the (possibly continued) line.
    #[error("{at}: unterminated {quote} quote{}", .at.continuation_note())]
    UnterminatedQuote {
        /// The line where the quote opens.
        at: Location,
        /// The quote character.
        quote: char,
    },
    /// The last line ends with a continuation backslash: the file ends in the middle of a
    /// directive.
    #[error(
        "{at}: the line ends with '\\' but the file ends there (dangling continuation){}",
        .at.continuation_note()
    )]
    DanglingContinuation {
        /// The line with the trailing backslash.
        at: Location,
    },
    /// An `options` directive without a module name.
    #[error(
        "{at}: 'options' without a module name (expected: options ko2iblnd key=value ...){}",
        .at.continuation_note()
    )]
    MissingModuleName {
        /// Where.
        at: Location,
    },
    /// The first word of a line is not a modprobe.d directive.
    #[error(
        "{at}: unknown directive '{}' (expected options, alias, install, remove, \
         softdep, weakdep, blacklist, include, config){}",
        shown(.directive),
        .at.continuation_note()
    )]
    UnknownDirective {
        /// Where.
        at: Location,
        /// The word found.
        directive: String,
    },
    /// The file starts with a UTF-8 byte-order mark (U+FEFF, bytes EF BB BF, as some editors
    /// save) and its first line is a directive. modprobe reads the mark as part of the first
    /// word, does not recognise the directive and skips the line, so the file is refused here.
    #[error(
        "{at}: the file starts with a UTF-8 byte-order mark (bytes EF BB BF): modprobe would \
         skip this first line as an unknown directive; save the file without it"
    )]
    ByteOrderMark {
        /// Line 1.
        at: Location,
    },
    /// The file is not UTF-8 text.
    #[error("{at}: not valid UTF-8 text")]
    NotUtf8 {
        /// The line holding the first invalid byte.
        at: Location,
    },
    /// The file could not be read.
    #[error("{}: cannot read: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl TunablesError {
    /// Where the error is (`None` for [`TunablesError::Io`], which has only a path).
    pub fn location(&self) -> Option<&Location> {
        match self {
            TunablesError::UnknownParameter { at, .. }
            | TunablesError::InvalidInteger { at, .. }
            | TunablesError::InvalidBool { at, .. }
            | TunablesError::InvalidString { at, .. }
            | TunablesError::MissingValue { at, .. }
            | TunablesError::OutOfRange { at, .. }
            | TunablesError::Inconsistent { at, .. }
            | TunablesError::UnterminatedQuote { at, .. }
            | TunablesError::DanglingContinuation { at }
            | TunablesError::MissingModuleName { at }
            | TunablesError::UnknownDirective { at, .. }
            | TunablesError::ByteOrderMark { at }
            | TunablesError::NotUtf8 { at } => Some(at),
            TunablesError::Io { .. } => None,
        }
    }

    /// The parameter involved, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            TunablesError::UnknownParameter { key, .. }
            | TunablesError::InvalidInteger { key, .. }
            | TunablesError::InvalidBool { key, .. }
            | TunablesError::InvalidString { key, .. }
            | TunablesError::MissingValue { key, .. }
            | TunablesError::OutOfRange { key, .. }
            | TunablesError::Inconsistent { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// `key` or `key=value`, as [`shown`].
fn kv(key: &str, value: &Option<String>) -> String {
    match value {
        Some(v) => format!("{}={}", shown(key), shown(v)),
        None => shown(key),
    }
}

/// `text` with the characters a terminal does not show, or shows as a plain space, written as
/// escapes (`\u{a0}`, `\t`), so that a message about a word holding one says why: a no-break
/// space pasted between two parameters, a zero-width space or a byte-order mark in a name.
pub(crate) fn shown(text: &str) -> String {
    let invisible = |c: char| {
        c.is_control()
            || (c.is_whitespace() && c != ' ')
            || matches!(
                c,
                '\u{ad}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
                    | '\u{2060}'..='\u{2064}' | '\u{feff}'
            )
    };
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if !invisible(c) => out.push(c),
            c if c.is_ascii() => out.extend(c.escape_default()),
            c => out.extend(c.escape_unicode()),
        }
    }
    out
}

fn did_you_mean(suggestion: &Option<&'static str>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean '{s}'?)"),
        None => String::new(),
    }
}
