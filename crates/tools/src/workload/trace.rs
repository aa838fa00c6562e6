//! Typed, bounded parser for Mooncake-format request traces (one JSON object per line:
//! `timestamp` in ms, `input_length`, `output_length`, `hash_ids` of 512-token blocks),
//! and the choice of trace a tool replays when given none. Errors name the 1-based line.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use kvtier_core::policy::BlockId;

/// Tokens per hashed block in Mooncake traces.
pub const BLOCK_TOKENS: u32 = 512;
/// Longest accepted line, in bytes: 1 MiB holds about 100k block ids, far above any prompt.
pub const LINE_BYTES_MAX: usize = 1 << 20;
/// Most blocks in one request: 16384 blocks are 8M tokens, above any context window.
pub const HASH_IDS_MAX: usize = 1 << 14;
/// Most requests in one trace: 4M, 350 times the bundled trace, keeps replays in memory.
pub const REQUESTS_MAX: usize = 1 << 22;
/// Largest accepted trace file, in bytes (1 GiB).
pub const TRACE_BYTES_MAX: u64 = 1 << 30;
/// The bundled trace, relative to the repository root.
pub const BUNDLED_TRACE: &str = "traces/conversation_trace.jsonl";
/// The first 500 requests of the bundled trace, used when no trace file is found.
pub const SAMPLE_TRACE: &str = include_str!("../../../../traces/sample.jsonl");

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Arrival time since the start of the trace, in milliseconds.
    pub timestamp_ms: u64,
    /// Prompt tokens; at most `hash_ids.len() * BLOCK_TOKENS`.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// The prompt's blocks in order; equal ids at the same position mean equal prefixes.
    pub hash_ids: Vec<BlockId>,
}

impl Request {
    /// Tokens held by the block at `position`: 512, or what is left for the last one.
    pub fn block_tokens(&self, position: usize) -> u32 {
        let start = (position as u64).saturating_mul(u64::from(BLOCK_TOKENS));
        let left = u64::from(self.input_tokens).saturating_sub(start);
        left.min(u64::from(BLOCK_TOKENS)) as u32
    }
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read; the caller names another file.
    #[error("reading {path}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is larger than [`TRACE_BYTES_MAX`].
    #[error("{path} is larger than {TRACE_BYTES_MAX} bytes")]
    TooLarge {
        /// The file.
        path: String,
    },
    /// A line is not a valid request; the message says which field is wrong.
    #[error("line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace has more than [`REQUESTS_MAX`] requests.
    #[error("more than {REQUESTS_MAX} requests")]
    TooManyRequests,
    /// The trace has no request.
    #[error("the trace has no request")]
    Empty,
}

#[derive(Deserialize)]
struct RawRequest {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<BlockId>,
}

fn line_error(line: usize, message: impl Into<String>) -> TraceError {
    TraceError::Line {
        line,
        message: message.into(),
    }
}

/// Parses one line (numbered `line` for errors). Unknown fields are ignored.
pub fn parse_line(text: &str, line: usize) -> Result<Request, TraceError> {
    if text.len() > LINE_BYTES_MAX {
        return Err(line_error(
            line,
            format!("longer than {LINE_BYTES_MAX} bytes"),
        ));
    }
    let raw: RawRequest =
        serde_json::from_str(text).map_err(|error| line_error(line, error.to_string()))?;
    if raw.hash_ids.is_empty() || raw.hash_ids.len() > HASH_IDS_MAX {
        return Err(line_error(
            line,
            format!("hash_ids must hold 1 to {HASH_IDS_MAX} ids"),
        ));
    }
    let covered = raw.hash_ids.len() as u64 * u64::from(BLOCK_TOKENS);
    if raw.input_length == 0 || u64::from(raw.input_length) > covered {
        return Err(line_error(
            line,
            format!(
                "input_length {} outside 1..={covered} for {} blocks",
                raw.input_length,
                raw.hash_ids.len()
            ),
        ));
    }
    Ok(Request {
        timestamp_ms: raw.timestamp,
        input_tokens: raw.input_length,
        output_tokens: raw.output_length,
        hash_ids: raw.hash_ids,
    })
}

/// Parses a whole trace: blank lines are skipped, timestamps must not decrease.
pub fn parse_str(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut requests: Vec<Request> = Vec::new();
    for (index, text) in text.lines().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        if requests.len() >= REQUESTS_MAX {
            return Err(TraceError::TooManyRequests);
        }
        let request = parse_line(text, index + 1)?;
        if let Some(previous) = requests.last() {
            if request.timestamp_ms < previous.timestamp_ms {
                return Err(line_error(index + 1, "timestamp goes backwards"));
            }
        }
        requests.push(request);
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(requests)
}

/// Reads and parses the trace at `path` (at most [`TRACE_BYTES_MAX`] bytes).
pub fn read_file(path: &Path) -> Result<Vec<Request>, TraceError> {
    let name = path.display().to_string();
    let io = |source| TraceError::Io {
        path: name.clone(),
        source,
    };
    let bytes = std::fs::metadata(path).map_err(io)?.len();
    if bytes > TRACE_BYTES_MAX {
        return Err(TraceError::TooLarge { path: name });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    parse_str(&text)
}

/// Loads the trace at `path`, else the bundled one (relative to the working directory, then
/// to the repository's root), else the embedded sample; returns a name for reports and the
/// requests, at least one. Fails when the chosen file is unreadable or malformed; never
/// falls back past a `path` the caller named.
pub fn load(path: Option<&Path>) -> Result<(String, Vec<Request>), TraceError> {
    let bundled = [
        PathBuf::from(BUNDLED_TRACE),
        // This crate's manifest is crates/tools/Cargo.toml: the repository is two above.
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .unwrap_or(Path::new(".."))
            .join(BUNDLED_TRACE),
    ];
    let found = path
        .map(Path::to_path_buf)
        .or_else(|| bundled.into_iter().find(|candidate| candidate.is_file()));
    match found {
        Some(path) => Ok((path.display().to_string(), read_file(&path)?)),
        None => Ok(("embedded sample".to_string(), parse_str(SAMPLE_TRACE)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_mooncake_line() {
        let line = r#"{"timestamp": 7, "input_length": 600, "output_length": 3, "hash_ids": [0, 9], "extra": 1}"#;
        let request = parse_line(line, 1).unwrap();
        assert_eq!(request.hash_ids, vec![0, 9]);
        assert_eq!(
            (
                request.block_tokens(0),
                request.block_tokens(1),
                request.block_tokens(2)
            ),
            (512, 88, 0)
        );
    }

    #[test]
    fn malformed_lines_name_their_line() {
        let rows = [
            "not json",
            r#"{"timestamp": 0, "input_length": 10, "output_length": 1}"#,
            r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []}"#,
            r#"{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [1]}"#,
            r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}"#,
            r#"{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}"#,
        ];
        for row in rows {
            let text = format!("{{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}}\n\n{row}\n");
            match parse_str(&text) {
                Err(TraceError::Line { line: 3, .. }) => {}
                other => panic!("{row}: {other:?}"),
            }
        }
        let backwards = "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}";
        assert!(matches!(
            parse_str(backwards),
            Err(TraceError::Line { line: 2, .. })
        ));
        assert!(matches!(parse_str("\n\n"), Err(TraceError::Empty)));
        assert!(matches!(
            read_file(Path::new("/nonexistent/trace.jsonl")),
            Err(TraceError::Io { .. })
        ));
    }
}
