//! The modprobe.d reader: physical lines → directives → settings.
//!
//! Rules (documented for users in `docs/tunables.md`):
//! * A `#` outside quotes starts a comment that runs to the end of the physical line.
//! * After the comment is removed, a line whose text ends with `\` (trailing blanks allowed)
//!   continues on the next physical line. The backslash is removed and the lines are joined
//!   with nothing in between, as kmod and the shell do; a comment therefore ends a continued
//!   directive unless the backslash comes before the `#`.
//! * Words are separated by blanks outside quotes; `"..."` and `'...'` may hold blanks and `#`,
//!   and may continue over a `\` line break. An unclosed quote is an error.
//! * `options MODULE key=value ...`: module and parameter names treat `-` as `_` (as kmod and
//!   the kernel's `parameq` do). `key="value"`, `key='value'` and `"key=value"` lose their
//!   outer quotes.

use super::LnetOption;
use super::error::{Location, TunablesError, Warning, WarningKind, shown};
use super::params::{self, CInt, Kind, Param, Setting, Settings, Value};

/// Directives kmod knows that this implementation skips with a warning.
const IGNORED_DIRECTIVES: &[&str] =
    &["alias", "install", "remove", "softdep", "weakdep", "blacklist", "include", "config"];

/// A directive after comment removal and continuation joining.
struct Logical {
    text: String,
    /// `(byte offset in text, physical line)` for each joined physical line, in order.
    segs: Vec<(usize, usize)>,
}

impl Logical {
    fn start_line(&self) -> usize {
        self.segs.first().map_or(0, |s| s.1)
    }

    /// The physical line holding byte `offset` of `text`.
    fn line_of(&self, offset: usize) -> usize {
        self.segs.iter().take_while(|s| s.0 <= offset).last().map_or(0, |s| s.1)
    }
}

/// Reads modprobe.d text into the caller's settings, LNet options and warnings.
pub(crate) struct Reader<'a> {
    source: &'a str,
    settings: &'a mut Settings,
    lnet: &'a mut Vec<LnetOption>,
    warnings: &'a mut Vec<Warning>,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(
        source: &'a str,
        settings: &'a mut Settings,
        lnet: &'a mut Vec<LnetOption>,
        warnings: &'a mut Vec<Warning>,
    ) -> Self {
        Reader { source, settings, lnet, warnings }
    }

    fn loc(&self, line: usize, start_line: usize) -> Location {
        Location::new(self.source, line, start_line)
    }

    /// Reads `text`, stopping at the first error.
    pub(crate) fn read(&mut self, text: &str) -> Result<(), TunablesError> {
        // A byte-order mark (some editors write one) is harmless before a blank or comment
        // line; before a directive modprobe would take it as part of the directive's name and
        // skip the line, so that is refused (see `directive`).
        let (text, bom) = match text.strip_prefix('\u{feff}') {
            Some(rest) => (rest, true),
            None => (text, false),
        };
        let mut cur: Option<Logical> = None;
        // Open quote carried over a continuation: (quote char, line where it opened).
        let mut quote: Option<(char, usize)> = None;
        let mut last_line = 0;
        for (idx, raw) in text.lines().enumerate() {
            let n = idx + 1;
            last_line = n;
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            // Find the comment start and the quote state at the end of the kept text.
            let mut cut = line.len();
            for (i, c) in line.char_indices() {
                match (quote, c) {
                    (None, '#') => {
                        cut = i;
                        break;
                    }
                    (None, '"' | '\'') => quote = Some((c, n)),
                    (Some((q, _)), c) if c == q => quote = None,
                    _ => {}
                }
            }
            let kept = &line[..cut];
            let trimmed = kept.trim_end();
            let (body, continues) = match trimmed.strip_suffix('\\') {
                Some(b) => (b, true),
                None => (kept, false),
            };
            let logical = cur.get_or_insert_with(|| Logical { text: String::new(), segs: vec![] });
            logical.segs.push((logical.text.len(), n));
            logical.text.push_str(body);
            if continues {
                continue;
            }
            let logical = cur.take().unwrap_or(Logical { text: String::new(), segs: vec![] });
            if let Some((q, opened)) = quote.take() {
                return Err(TunablesError::UnterminatedQuote {
                    at: self.loc(opened, logical.start_line()),
                    quote: q,
                });
            }
            if bom && logical.start_line() == 1 && !split_words(&logical.text).is_empty() {
                return Err(TunablesError::ByteOrderMark { at: self.loc(1, 1) });
            }
            self.directive(&logical)?;
        }
        if let Some(logical) = cur {
            return Err(TunablesError::DanglingContinuation {
                at: self.loc(last_line, logical.start_line()),
            });
        }
        Ok(())
    }

    fn directive(&mut self, logical: &Logical) -> Result<(), TunablesError> {
        let words = split_words(&logical.text);
        let Some(&(first_at, directive)) = words.first() else {
            return Ok(()); // blank or comment-only
        };
        let start = logical.start_line();
        let source = self.source;
        let at = |offset: usize| Location::new(source, logical.line_of(offset), start);
        match directive {
            "options" => {
                let Some(&(mod_at, module)) = words.get(1) else {
                    return Err(TunablesError::MissingModuleName { at: at(first_at) });
                };
                let module = module.replace('-', "_");
                let params = &words[2..];
                match module.as_str() {
                    "ko2iblnd" => {
                        for &(off, word) in params {
                            self.ko2iblnd_param(word, at(off))?;
                        }
                    }
                    "lnet" => {
                        for &(off, word) in params {
                            let (key, raw) = split_param(word);
                            let value = raw.map(|v| unquote(v).to_owned());
                            self.lnet.push(LnetOption { key: key.to_owned(), value, at: at(off) });
                        }
                    }
                    _ => self.warnings.push(Warning::new(
                        Some(at(mod_at)),
                        WarningKind::Ignored,
                        format!(
                            "options for module '{}' ignored (only ko2iblnd and lnet options \
                             are read)",
                            shown(&module)
                        ),
                    )),
                }
            }
            d if IGNORED_DIRECTIVES.contains(&d) => self.warnings.push(Warning::new(
                Some(at(first_at)),
                WarningKind::Ignored,
                format!("'{d}' directive ignored (this implementation loads no kernel module)"),
            )),
            d => {
                return Err(TunablesError::UnknownDirective { at: at(first_at), directive: d.to_owned() });
            }
        }
        Ok(())
    }

    fn ko2iblnd_param(&mut self, word: &str, at: Location) -> Result<(), TunablesError> {
        // Messages show the value as written (`raw`, quotes included); parsing sees it unquoted.
        let (key, raw) = split_param(word);
        let key = key.replace('-', "_");
        let Some(p) = Param::from_name(&key) else {
            if let Some((_, why)) = params::REMOVED.iter().find(|(n, _)| *n == key) {
                let shown = match raw {
                    Some(v) => format!("{key}={v}"),
                    None => key.clone(),
                };
                self.warnings.push(Warning::new(
                    Some(at),
                    WarningKind::Obsolete,
                    format!("{shown}: obsolete ko2iblnd parameter, ignored ({why})"),
                ));
                return Ok(());
            }
            let suggestion = params::suggest(&key);
            let value = raw.map(str::to_owned);
            return Err(TunablesError::UnknownParameter { at, key, value, suggestion });
        };
        let text = raw.unwrap_or_default().to_owned();
        let parsed = match (p.kind(), raw.map(unquote)) {
            // A bare flag means "on", as the kernel's bool parameters.
            (Kind::Bool, None) => Value::Bool(true),
            // An empty list: accept every peer (the default, written out).
            (Kind::Str, Some("")) if p == Param::AcceptNids => Value::Str(String::new()),
            (_, None | Some("")) => return Err(TunablesError::MissingValue { at, key }),
            (Kind::Bool, Some(v)) => match params::parse_bool(v) {
                Some(b) => Value::Bool(b),
                None => {
                    return Err(TunablesError::InvalidBool { at, key, value: text });
                }
            },
            (Kind::Int, Some(v)) => match params::parse_c_int(v) {
                CInt::Ok(i) => Value::Int(i),
                CInt::Overflow => {
                    return Err(TunablesError::OutOfRange {
                        at,
                        key,
                        value: text,
                        allowed: "a C int (-2147483648..=2147483647)",
                    });
                }
                CInt::Invalid => {
                    return Err(TunablesError::InvalidInteger { at, key, value: text });
                }
            },
            (Kind::Str, Some(v)) => Value::Str(v.to_owned()),
        };
        let text = if raw.is_some() { text } else { "1".to_owned() };
        let setting = Setting { value: parsed, text, at: Some(at.clone()) };
        let previous = self.settings.set(p, setting);
        // An earlier line that only restated the default (as the shipped ko2iblnd.conf does for
        // every parameter) is overridden silently: dropping it changes nothing. Otherwise the
        // earlier line is dead, which is worth a word.
        let restated_default =
            previous.value == Settings::from_tunables(&super::Tunables::default()).get(p).value;
        if let Some(prev_at) = previous.at.filter(|_| !restated_default) {
            let where_ = if prev_at.source == at.source {
                format!("line {}", prev_at.line)
            } else {
                prev_at.to_string()
            };
            self.warnings.push(Warning::new(
                Some(at),
                WarningKind::Overridden,
                format!("{key} set again (was {key}={} at {where_}); the last value wins", previous.text),
            ));
        }
        Ok(())
    }
}

/// Splits on blanks outside quotes; returns `(byte offset, word)` pairs.
fn split_words(text: &str) -> Vec<(usize, &str)> {
    let mut words = Vec::new();
    let mut start: Option<usize> = None;
    let mut quote: Option<char> = None;
    for (i, c) in text.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c.is_ascii_whitespace() => {
                if let Some(s) = start.take() {
                    words.push((s, &text[s..i]));
                }
            }
            None => {
                if start.is_none() {
                    start = Some(i);
                }
                if c == '"' || c == '\'' {
                    quote = Some(c);
                }
            }
        }
    }
    if let Some(s) = start {
        words.push((s, &text[s..]));
    }
    words
}

/// Removes one pair of matching outer quotes.
fn unquote(s: &str) -> &str {
    for q in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(q) && s.ends_with(q) {
            return &s[1..s.len() - 1];
        }
    }
    s
}

/// `key=value` → (`key`, `Some(value)`), `key` → (`key`, `None`). Outer quotes are removed
/// from a fully quoted word (`"key=value"`); the value keeps its own (see [`unquote`]).
fn split_param(word: &str) -> (&str, Option<&str>) {
    let word = unquote(word);
    match word.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (word, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_respect_quotes() {
        let w: Vec<&str> = split_words(r#"options lnet networks="o2ib0(ib0) tcp0" x='a b'"#)
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        assert_eq!(w, ["options", "lnet", r#"networks="o2ib0(ib0) tcp0""#, "x='a b'"]);
        assert_eq!(split_param(r#""a=b c""#), ("a", Some("b c")));
        assert_eq!(split_param("k='v'"), ("k", Some("'v'")));
        assert_eq!(split_param("flag"), ("flag", None));
        assert_eq!(split_param("k="), ("k", Some("")));
        assert_eq!(unquote("'v'"), "v");
        assert_eq!(unquote(r#""v""#), "v");
        assert_eq!(unquote(r#""v'"#), r#""v'"#);
        assert_eq!(unquote(r#"""#), r#"""#);
    }
}
