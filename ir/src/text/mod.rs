//! The IR text format. See the grammar in [`parser`]'s module documentation.

/// Parse a double-quoted string with Rust-style escapes at the start of `s`;
/// returns the unescaped text and the number of bytes consumed.
pub fn unescape_quoted(s: &str) -> Result<(String, usize), String> {
    let bytes = unescape_quoted_bytes(s)?;
    let text = String::from_utf8(bytes.0).map_err(|_| "string is not valid UTF-8".to_string())?;
    Ok((text, bytes.1))
}

/// Like [`unescape_quoted`] but for byte strings (`\xNN` may produce any byte).
pub fn unescape_quoted_bytes(s: &str) -> Result<(Vec<u8>, usize), String> {
    let b = s.as_bytes();
    if b.first() != Some(&b'"') {
        return Err("expected `\"`".into());
    }
    let mut out = Vec::new();
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'"' => return Ok((out, i + 1)),
            b'\\' => {
                let c = *b.get(i + 1).ok_or("unterminated escape")?;
                i += 2;
                match c {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'0' => out.push(0),
                    b'\\' => out.push(b'\\'),
                    b'"' => out.push(b'"'),
                    b'\'' => out.push(b'\''),
                    b'x' => {
                        let h = s.get(i..i + 2).ok_or("short \\x escape")?;
                        out.push(u8::from_str_radix(h, 16).map_err(|_| format!("bad \\x escape `{h}`"))?);
                        i += 2;
                    }
                    b'u' => {
                        let rest = s.get(i..).ok_or("bad \\u escape")?;
                        let close = rest.find('}').ok_or("unterminated \\u{...}")?;
                        let hex = rest.get(1..close).ok_or("bad \\u escape")?;
                        let cp = u32::from_str_radix(hex, 16).map_err(|_| format!("bad \\u escape `{hex}`"))?;
                        let ch = char::from_u32(cp).ok_or("bad code point")?;
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        i += close + 1;
                    }
                    other => return Err(format!("unknown escape `\\{}`", other as char)),
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Err("unterminated string".into())
}

/// Quote a byte string so that [`unescape_quoted_bytes`] gives it back.
pub fn quote_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() + 2);
    s.push('"');
    let text = std::str::from_utf8(b);
    match text {
        Ok(t) => {
            for ch in t.chars() {
                match ch {
                    '"' => s.push_str("\\\""),
                    '\\' => s.push_str("\\\\"),
                    '\n' => s.push_str("\\n"),
                    '\t' => s.push_str("\\t"),
                    '\r' => s.push_str("\\r"),
                    c if c.is_control() => s.push_str(&format!("\\u{{{:x}}}", c as u32)),
                    c => s.push(c),
                }
            }
        }
        Err(_) => {
            for &c in b {
                match c {
                    b'"' => s.push_str("\\\""),
                    b'\\' => s.push_str("\\\\"),
                    0x20..=0x7e => s.push(c as char),
                    _ => s.push_str(&format!("\\x{c:02x}")),
                }
            }
        }
    }
    s.push('"');
    s
}

pub mod parser;
pub mod printer;

pub use parser::{parse_graph, parse_model, parse_type, ParseError};
pub use printer::{print_model, print_model_with, value_ref, PrintOptions};
