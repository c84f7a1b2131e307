//! Tensor dimensions: integers, named symbols (`batch`, `seq`) and the small
//! expressions exporters build from them (`batch*seq`, `seq/2`, `2*seq+1`).
//!
//! A [`Dim`] is kept in a canonical form — a polynomial with integer
//! coefficients over *atoms*, where an atom is either a symbol or a floor
//! division of a polynomial by a constant that does not divide it exactly.
//! Canonical means two dims that are equal as polynomials compare equal and
//! print identically, which is what makes the text format round-trip and what
//! lets shape inference see that `batch*seq*768 / (batch*seq*12)` is `64`.
//!
//! Arithmetic is bounded, because dims come from untrusted files: an integer
//! result that overflows `i64`, a polynomial of more than [`MAX_TERMS`]
//! terms, a monomial of degree above [`MAX_DEGREE`] or floor divisions nested
//! deeper than [`MAX_NESTING`] yield an *invalid* dim instead of panicking or
//! growing without end (`(a+…+j)^12` expands to millions of terms). An
//! invalid dim absorbs every operation, equals no other invalid dim, and
//! [`Dim::is_invalid`] reports it; shape inference turns it into an error
//! naming the node, the text parser into a parse error. The parser also
//! limits parenthesis nesting, so no input can exhaust the stack.

use std::cmp::Ordering;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;

/// The most terms one dimension polynomial may have.
pub const MAX_TERMS: usize = 1024;
/// The highest degree of one monomial.
pub const MAX_DEGREE: usize = 64;
/// How deep floor divisions (and parentheses in the text syntax) may nest.
pub const MAX_NESTING: usize = 32;

/// Identities of invalid dims: each invalid result is distinct, so two dims
/// that overflowed never compare equal by accident. Never printed, so output
/// stays deterministic.
static NEXT_INVALID: AtomicU64 = AtomicU64::new(0);

/// An indivisible factor of a monomial.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
enum Atom {
    Sym(Arc<str>),
    /// `floor(poly / d)` with `d >= 2` and `poly` not a multiple of `d`.
    FloorDiv(Box<Poly>, i64),
    /// The result of arithmetic that exceeded a limit (see the module doc);
    /// only ever the sole atom of a dim.
    Invalid(u64),
}

/// A product of atoms, sorted; the empty monomial is the constant `1`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
struct Mono(Vec<Atom>);

impl Mono {
    fn mul(&self, other: &Mono) -> Mono {
        let mut atoms = self.0.clone();
        atoms.extend(other.0.iter().cloned());
        atoms.sort();
        Mono(atoms)
    }

    /// `self / other` when `other`'s atoms are a sub-multiset of `self`'s.
    fn div(&self, other: &Mono) -> Option<Mono> {
        let mut rest = self.0.clone();
        for a in &other.0 {
            let i = rest.iter().position(|b| b == a)?;
            rest.remove(i);
        }
        Some(Mono(rest))
    }
}

/// Sum of `coeff * mono`, sorted by monomial, no zero coefficients.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
struct Poly(Vec<(Mono, i64)>);

impl PartialOrd for Poly {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Poly {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

impl Poly {
    fn constant(c: i64) -> Poly {
        if c == 0 {
            Poly(Vec::new())
        } else {
            Poly(vec![(Mono::default(), c)])
        }
    }

    fn invalid() -> Poly {
        let id = NEXT_INVALID.fetch_add(1, AtomicOrdering::Relaxed);
        Poly(vec![(Mono(vec![Atom::Invalid(id)]), 1)])
    }

    fn is_invalid(&self) -> bool {
        matches!(self.0.as_slice(), [(m, _)] if matches!(m.0.as_slice(), [Atom::Invalid(_)]))
    }

    /// How deeply floor divisions nest inside this polynomial.
    fn nesting(&self) -> usize {
        self.0
            .iter()
            .flat_map(|(m, _)| m.0.iter())
            .map(|a| match a {
                Atom::FloorDiv(p, _) => 1 + p.nesting(),
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// Canonical sum of terms; invalid when a coefficient overflows or the
    /// result exceeds the size limits.
    fn from_terms(mut terms: Vec<(Mono, i64)>) -> Poly {
        if terms.iter().any(|(m, _)| m.0.iter().any(|a| matches!(a, Atom::Invalid(_)))) {
            return Poly::invalid();
        }
        terms.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(Mono, i64)> = Vec::with_capacity(terms.len());
        for (m, c) in terms {
            match out.last_mut() {
                Some((lm, lc)) if *lm == m => match lc.checked_add(c) {
                    Some(v) => *lc = v,
                    None => return Poly::invalid(),
                },
                _ => out.push((m, c)),
            }
        }
        out.retain(|(_, c)| *c != 0);
        if out.len() > MAX_TERMS || out.iter().any(|(m, _)| m.0.len() > MAX_DEGREE) {
            return Poly::invalid();
        }
        Poly(out)
    }

    fn as_const(&self) -> Option<i64> {
        match self.0.as_slice() {
            [] => Some(0),
            [(m, c)] if m.0.is_empty() => Some(*c),
            _ => None,
        }
    }

    fn add(&self, o: &Poly) -> Poly {
        Poly::from_terms(self.0.iter().chain(o.0.iter()).cloned().collect())
    }

    fn scale(&self, k: i64) -> Poly {
        let mut terms = Vec::with_capacity(self.0.len());
        for (m, c) in &self.0 {
            match c.checked_mul(k) {
                Some(v) => terms.push((m.clone(), v)),
                None => return Poly::invalid(),
            }
        }
        Poly::from_terms(terms)
    }

    fn mul(&self, o: &Poly) -> Poly {
        // Refuse before expanding: the product of two large sums is where
        // hostile dims explode.
        if self.is_invalid() || o.is_invalid() || self.0.len().saturating_mul(o.0.len()) > MAX_TERMS * 4 {
            return Poly::invalid();
        }
        let mut terms = Vec::with_capacity(self.0.len() * o.0.len());
        for (ma, ca) in &self.0 {
            for (mb, cb) in &o.0 {
                if ma.0.len() + mb.0.len() > MAX_DEGREE {
                    return Poly::invalid();
                }
                match ca.checked_mul(*cb) {
                    Some(c) => terms.push((ma.mul(mb), c)),
                    None => return Poly::invalid(),
                }
            }
        }
        Poly::from_terms(terms)
    }

    /// Exact division by a single term `c * m`, if it divides every term.
    fn div_exact_term(&self, m: &Mono, c: i64) -> Option<Poly> {
        if c == 0 {
            return None;
        }
        let mut terms = Vec::with_capacity(self.0.len());
        for (tm, tc) in &self.0 {
            // `checked_rem` is `None` only for `i64::MIN % -1`, whose quotient overflows.
            if tc.checked_rem(c)? != 0 {
                return None;
            }
            terms.push((tm.div(m)?, tc.checked_div(c)?));
        }
        Some(Poly::from_terms(terms))
    }

    fn is_nonneg_obviously(&self) -> bool {
        self.0.iter().all(|(_, c)| *c > 0)
    }
}

/// One dimension of a tensor shape.
///
/// Construct with [`Dim::from`] (`i64`), [`Dim::sym`], and the arithmetic
/// methods; compare with `==`; print with `Display` (the text-format syntax,
/// parsed back by [`Dim::parse`]).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim(Poly);

impl From<i64> for Dim {
    fn from(c: i64) -> Dim {
        Dim(Poly::constant(c))
    }
}

impl Dim {
    /// A named symbolic dimension such as `batch`.
    pub fn sym(name: &str) -> Dim {
        Dim(Poly(vec![(Mono(vec![Atom::Sym(Arc::from(name))]), 1)]))
    }

    /// The value, when the dimension is a known integer.
    pub fn as_const(&self) -> Option<i64> {
        self.0.as_const()
    }

    /// The symbol name, when the dimension is exactly one symbol.
    pub fn as_sym(&self) -> Option<&str> {
        match self.0 .0.as_slice() {
            [(m, 1)] => match m.0.as_slice() {
                [Atom::Sym(s)] => Some(s),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether arithmetic producing this dim exceeded a limit (overflowed
    /// `i64` or grew too complex); such a dim must be reported, not used.
    pub fn is_invalid(&self) -> bool {
        self.0.is_invalid()
    }

    /// Whether the dimension involves no symbol.
    pub fn is_const(&self) -> bool {
        self.as_const().is_some()
    }

    /// Every symbol the expression mentions, sorted and deduplicated.
    pub fn symbols(&self) -> Vec<Arc<str>> {
        fn walk(p: &Poly, out: &mut Vec<Arc<str>>) {
            for (m, _) in &p.0 {
                for a in &m.0 {
                    match a {
                        Atom::Sym(s) => out.push(s.clone()),
                        Atom::FloorDiv(q, _) => walk(q, out),
                        Atom::Invalid(_) => {}
                    }
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.0, &mut out);
        out.sort();
        out.dedup();
        out
    }

    pub fn add(&self, o: &Dim) -> Dim {
        Dim(self.0.add(&o.0))
    }

    pub fn sub(&self, o: &Dim) -> Dim {
        Dim(self.0.add(&o.0.scale(-1)))
    }

    pub fn mul(&self, o: &Dim) -> Dim {
        Dim(self.0.mul(&o.0))
    }

    pub fn neg(&self) -> Dim {
        Dim(self.0.scale(-1))
    }

    /// `floor(self / d)` for a constant `d > 0`; exact where it divides.
    pub fn floor_div_const(&self, d: i64) -> Option<Dim> {
        if d <= 0 {
            return None;
        }
        if d == 1 || self.is_invalid() {
            return Some(self.clone());
        }
        if let Some(c) = self.as_const() {
            return Some(Dim::from(c.div_euclid(d)));
        }
        if let Some(p) = self.0.div_exact_term(&Mono::default(), d) {
            return Some(Dim(p));
        }
        if self.0.nesting() >= MAX_NESTING {
            return Some(Dim(Poly::invalid()));
        }
        Some(Dim(Poly(vec![(Mono(vec![Atom::FloorDiv(Box::new(self.0.clone()), d)]), 1)])))
    }

    /// `ceil(self / d)` for a constant `d > 0`.
    pub fn ceil_div_const(&self, d: i64) -> Option<Dim> {
        self.add(&Dim::from(d.checked_sub(1)?)).floor_div_const(d)
    }

    /// `self / o` when the division is exact as polynomials (every term of
    /// `self` is a multiple of the single-term divisor `o`), or both are
    /// integers and `o` divides `self`.
    /// An invalid operand gives an invalid result, so the failure is
    /// reported where the dim is used rather than lost.
    pub fn div_exact(&self, o: &Dim) -> Option<Dim> {
        if self.is_invalid() || o.is_invalid() {
            return Some(Dim(Poly::invalid()));
        }
        if let (Some(a), Some(b)) = (self.as_const(), o.as_const()) {
            // `i64::MIN / -1` overflows: that element count is not an i64.
            return match (a.checked_rem(b), a.checked_div(b)) {
                (Some(0), Some(q)) => Some(Dim::from(q)),
                (None, _) | (Some(0), None) if b != 0 => Some(Dim(Poly::invalid())),
                _ => None,
            };
        }
        match o.0 .0.as_slice() {
            [(m, c)] => self.0.div_exact_term(m, *c).map(Dim),
            _ if self == o => Some(Dim::from(1)),
            _ => None,
        }
    }

    /// Whether the dimension is known to be ≥ 0 (true for symbols, which
    /// stand for sizes, and for sums of them with positive coefficients).
    pub fn is_nonneg(&self) -> bool {
        if self.is_invalid() {
            return false;
        }
        self.as_const().map_or_else(|| self.0.is_nonneg_obviously(), |c| c >= 0)
    }

    /// Substitute integer values for symbols; the result is constant when
    /// every symbol it mentions is bound.
    pub fn substitute(&self, bind: &dyn Fn(&str) -> Option<Dim>) -> Dim {
        fn poly(p: &Poly, bind: &dyn Fn(&str) -> Option<Dim>) -> Dim {
            let mut acc = Dim::from(0);
            for (m, c) in &p.0 {
                let mut term = Dim::from(*c);
                for a in &m.0 {
                    let f = match a {
                        Atom::Sym(s) => bind(s).unwrap_or_else(|| Dim::sym(s)),
                        Atom::FloorDiv(q, d) => {
                            let q = poly(q, bind);
                            q.floor_div_const(*d).unwrap_or(q)
                        }
                        Atom::Invalid(_) => Dim(Poly::invalid()),
                    };
                    term = term.mul(&f);
                }
                acc = acc.add(&term);
            }
            acc
        }
        poly(&self.0, bind)
    }

    /// Parse the text syntax written by `Display`.
    pub fn parse(s: &str) -> Result<Dim, String> {
        let toks = lex_dim(s)?;
        let mut p = DimParser { toks, pos: 0, depth: 0 };
        let d = p.expr()?;
        if p.pos != p.toks.len() {
            return Err(format!("unexpected `{}` in dimension `{s}`", p.toks[p.pos]));
        }
        if d.is_invalid() {
            return Err(format!(
                "dimension `{}` is too complex (more than {MAX_TERMS} terms, degree above {MAX_DEGREE}, \
                 or a value outside i64)",
                abbreviate(s)
            ));
        }
        Ok(d)
    }
}

/// The start of a long dimension text, for error messages.
fn abbreviate(s: &str) -> String {
    const KEEP: usize = 48;
    match s.char_indices().nth(KEEP) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Whether a symbol can be written bare in the text format.
pub fn is_plain_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn write_sym(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    if is_plain_ident(s) {
        f.write_str(s)
    } else {
        write!(f, "\"{}\"", s.escape_default())
    }
}

fn write_atom(f: &mut fmt::Formatter<'_>, a: &Atom, alone: bool) -> fmt::Result {
    match a {
        Atom::Sym(s) => write_sym(f, s),
        // Not parseable on purpose: an invalid dim must never round-trip.
        Atom::Invalid(_) => f.write_str("<invalid>"),
        Atom::FloorDiv(p, d) => {
            let single_atom = matches!(p.0.as_slice(), [(m, 1)] if m.0.len() == 1 && matches!(m.0[0], Atom::Sym(_)));
            // `a*b/2` would read as `(a*b)/2`: inside a product the whole
            // division is parenthesised.
            if !alone {
                f.write_str("(")?;
            }
            if single_atom {
                write_poly(f, p)?;
            } else {
                f.write_str("(")?;
                write_poly(f, p)?;
                f.write_str(")")?;
            }
            write!(f, "/{d}")?;
            if !alone {
                f.write_str(")")?;
            }
            Ok(())
        }
    }
}

fn write_poly(f: &mut fmt::Formatter<'_>, p: &Poly) -> fmt::Result {
    if p.0.is_empty() {
        return f.write_str("0");
    }
    // Highest-degree terms first, the constant last: `2*seq+1`.
    let mut terms: Vec<&(Mono, i64)> = p.0.iter().collect();
    terms.sort_by(|a, b| b.0 .0.len().cmp(&a.0 .0.len()).then(a.0.cmp(&b.0)));
    for (i, (m, c)) in terms.into_iter().enumerate() {
        let (neg, mag) = (*c < 0, c.unsigned_abs());
        match (i, neg) {
            (0, true) => f.write_str("-")?,
            (0, false) => {}
            (_, true) => f.write_str("-")?,
            (_, false) => f.write_str("+")?,
        }
        if m.0.is_empty() {
            write!(f, "{mag}")?;
            continue;
        }
        if mag != 1 {
            write!(f, "{mag}*")?;
        }
        let alone = mag == 1 && m.0.len() == 1;
        for (j, a) in m.0.iter().enumerate() {
            if j > 0 {
                f.write_str("*")?;
            }
            write_atom(f, a, alone)?;
        }
    }
    Ok(())
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_poly(f, &self.0)
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Clone, PartialEq, Debug)]
enum DimTok {
    Int(i64),
    Ident(String),
    Punct(char),
}

impl fmt::Display for DimTok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DimTok::Int(i) => write!(f, "{i}"),
            DimTok::Ident(s) => f.write_str(s),
            DimTok::Punct(c) => write!(f, "{c}"),
        }
    }
}

fn lex_dim(s: &str) -> Result<Vec<DimTok>, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let st = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let v = s[st..i].parse::<i64>().map_err(|e| format!("bad integer in `{s}`: {e}"))?;
            out.push(DimTok::Int(v));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let st = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(DimTok::Ident(s[st..i].to_string()));
        } else if c == '"' {
            let (text, used) = crate::text::unescape_quoted(&s[i..]).map_err(|e| format!("{e} in `{s}`"))?;
            out.push(DimTok::Ident(text));
            i += used;
        } else if "+-*/()".contains(c) {
            out.push(DimTok::Punct(c));
            i += 1;
        } else {
            return Err(format!("unexpected character `{c}` in dimension `{s}`"));
        }
    }
    Ok(out)
}

struct DimParser {
    toks: Vec<DimTok>,
    pos: usize,
    /// Current nesting of parentheses and unary minus, bounded by
    /// [`MAX_NESTING`] so no input recurses deeply.
    depth: usize,
}

impl DimParser {
    fn peek(&self) -> Option<&DimTok> {
        self.toks.get(self.pos)
    }

    fn expr(&mut self) -> Result<Dim, String> {
        let mut acc = self.term()?;
        while let Some(DimTok::Punct(c @ ('+' | '-'))) = self.peek().cloned() {
            self.pos += 1;
            let t = self.term()?;
            acc = if c == '+' { acc.add(&t) } else { acc.sub(&t) };
        }
        Ok(acc)
    }

    fn term(&mut self) -> Result<Dim, String> {
        let mut acc = self.unary()?;
        while let Some(DimTok::Punct(c @ ('*' | '/'))) = self.peek().cloned() {
            self.pos += 1;
            if c == '*' {
                acc = acc.mul(&self.unary()?);
            } else {
                match self.peek().cloned() {
                    Some(DimTok::Int(d)) if d > 0 => {
                        self.pos += 1;
                        acc = acc.floor_div_const(d).ok_or("bad divisor")?;
                    }
                    _ => return Err("a dimension can only be divided by a positive integer".into()),
                }
            }
        }
        Ok(acc)
    }

    fn unary(&mut self) -> Result<Dim, String> {
        self.depth += 1;
        let r = if self.depth > MAX_NESTING {
            Err(format!("dimension nests parentheses or signs deeper than {MAX_NESTING}"))
        } else {
            self.unary_inner()
        };
        self.depth -= 1;
        r
    }

    fn unary_inner(&mut self) -> Result<Dim, String> {
        match self.peek().cloned() {
            Some(DimTok::Punct('-')) => {
                self.pos += 1;
                Ok(self.unary()?.neg())
            }
            Some(DimTok::Punct('(')) => {
                self.pos += 1;
                let e = self.expr()?;
                if self.peek() != Some(&DimTok::Punct(')')) {
                    return Err("expected `)` in dimension".into());
                }
                self.pos += 1;
                Ok(e)
            }
            Some(DimTok::Int(v)) => {
                self.pos += 1;
                Ok(Dim::from(v))
            }
            Some(DimTok::Ident(s)) => {
                self.pos += 1;
                Ok(Dim::sym(&s))
            }
            Some(t) => Err(format!("unexpected `{t}` in dimension")),
            None => Err("empty dimension".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Dim {
        Dim::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn canonical_printing_round_trips() {
        for s in [
            "batch",
            "batch*seq",
            "seq/2",
            "2*seq+1",
            "(seq+1)/2",
            "seq-1",
            "-seq",
            "768*batch*seq",
            "0",
            "2*(seq/2)",
            "batch*(seq/2)",
            "((seq+1)/2)/3",
            "batch*\"odd dim\"",
        ] {
            assert_eq!(d(s).to_string(), s, "printing {s}");
        }
    }

    #[test]
    fn arithmetic_is_canonical() {
        assert_eq!(d("seq*batch"), d("batch*seq"));
        assert_eq!(d("batch+batch"), d("2*batch"));
        assert_eq!(d("(2*seq+4)/2"), d("seq+2"));
        assert_eq!(d("batch*seq*768").div_exact(&d("12*batch*seq")), Some(d("64")));
        assert_eq!(d("batch*seq").div_exact(&d("seq")), Some(d("batch")));
        assert_eq!(d("batch+1").div_exact(&d("seq")), None);
        assert_eq!(d("7").floor_div_const(2), Some(d("3")));
        assert_eq!(d("seq").ceil_div_const(2).map(|x| x.to_string()), Some("(seq+1)/2".into()));
    }

    #[test]
    fn overflow_and_blowup_give_invalid_dims_not_panics() {
        // 2^32 * 2^31 = 2^63 does not fit i64.
        let big = d("4294967296").mul(&d("2147483648"));
        assert!(big.is_invalid());
        // i64::MIN / -1 and i64::MIN % -1 overflow: invalid, not a panic.
        let min = Dim::from(i64::MIN);
        assert!(min.div_exact(&Dim::from(-1)).is_some_and(|q| q.is_invalid()));
        assert!(min.neg().is_invalid());
        assert_eq!(d("7").div_exact(&d("0")), None);
        // (a+…+j)^3 has 220 terms and parses; its square would have 48,400
        // before collecting: refused before it is expanded.
        let s = "(a+b+c+d+e+f+g+h+i+j)";
        let cube = d(&format!("{s}*{s}*{s}"));
        assert_eq!(cube.to_string().matches('+').count(), 219);
        assert!(cube.mul(&cube).is_invalid());
        assert!(cube.mul(&cube).add(&d("1")).is_invalid(), "invalid absorbs");
        assert_ne!(cube.mul(&cube), cube.mul(&cube), "two invalid dims are never equal");
        assert!(Dim::parse(&format!("{s}*{s}*{s}*{s}*{s}*{s}")).is_err());
        // A monomial of degree 65.
        assert!(Dim::parse(&vec!["a"; 65].join("*")).is_err());
        // Floor divisions nested past the limit.
        let mut x = d("a+1");
        for _ in 0..=MAX_NESTING {
            x = x.floor_div_const(2).expect("positive divisor").add(&d("1"));
        }
        assert!(x.is_invalid());
    }

    #[test]
    fn deep_text_is_a_parse_error() {
        let deep = format!("{}a{}", "(".repeat(20_000), ")".repeat(20_000));
        assert!(Dim::parse(&deep).expect_err("too deep").contains("deeper than"));
        assert!(Dim::parse(&format!("{}a", "-".repeat(20_000))).is_err());
        let fine = format!("{}a{}", "(".repeat(10), ")".repeat(10));
        assert_eq!(d(&fine), d("a"));
    }

    #[test]
    fn substitution_binds_symbols() {
        let e = d("(batch*seq+1)/2");
        let r = e.substitute(&|s| match s {
            "batch" => Some(Dim::from(4)),
            "seq" => Some(Dim::from(3)),
            _ => None,
        });
        assert_eq!(r.as_const(), Some(6));
    }
}
