//! Sizes from Python: an int, or a string with an optional binary suffix
//! (`K`, `M`, `G`, `T`, optionally followed by `B`/`iB`). Pure functions;
//! no locks.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// Why a size string was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SizeError {
    /// Not a number with a known suffix.
    Malformed,
    /// Does not fit in a `usize`.
    Overflow,
}

/// Parses `"256M"`, `"2MiB"`, `"4k"`, `"4096"` (powers of 1024).
pub(crate) fn parse(s: &str) -> Result<usize, SizeError> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: usize = num.parse().map_err(|_| SizeError::Malformed)?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(SizeError::Malformed),
    };
    n.checked_mul(1usize << shift).ok_or(SizeError::Overflow)
}

/// A size from a Python int or string.
pub(crate) fn from_py(v: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(n) = v.extract::<usize>() {
        return Ok(n);
    }
    let s: String = v.extract().map_err(|_| {
        PyTypeError::new_err("a size is a non-negative int or a string like \"256M\"")
    })?;
    parse(&s).map_err(|e| PyValueError::new_err(format!("bad size {s:?}: {e:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("4K"), Ok(4096));
        assert_eq!(parse("2M"), Ok(2 << 20));
        assert_eq!(parse("256MiB"), Ok(256 << 20));
        assert_eq!(parse(" 1g "), Ok(1 << 30));
        assert_eq!(parse("x"), Err(SizeError::Malformed));
        assert_eq!(parse("4Q"), Err(SizeError::Malformed));
        assert_eq!(parse("99999999999T"), Err(SizeError::Overflow));
    }
}
