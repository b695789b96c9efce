//! Capped output capture and end-of-command marker detection.
//!
//! A command may print a gigabyte; the agent needs the start (what the command did) and
//! the end (how it finished), not the middle. [`CappedOutput`] keeps a head and a tail of
//! bounded size and counts what it dropped, so memory stays flat however much arrives.
//! [`MarkerScanner`] finds the server's unique end marker in a byte stream that arrives in
//! arbitrary chunks, passing everything before it through untouched.

/// The output cap a tool uses when the request sets none.
pub const DEFAULT_MAX_OUTPUT: usize = 32 * 1024;

/// Head-and-tail capture of a byte stream.
#[derive(Debug)]
pub struct CappedOutput {
    head: Vec<u8>,
    head_cap: usize,
    tail: Vec<u8>,
    tail_cap: usize,
    total: u64,
}

impl CappedOutput {
    /// A capture keeping at most `max` bytes: half from the start, half from the end.
    pub fn new(max: usize) -> Self {
        let max = max.max(2);
        CappedOutput {
            head: Vec::new(),
            head_cap: max / 2,
            tail: Vec::new(),
            tail_cap: max - max / 2,
            total: 0,
        }
    }

    /// Appends bytes.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.is_empty() {
            return;
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend_from_slice(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        self.tail.extend_from_slice(bytes);
        // Trim lazily (at twice the cap) so a stream of small chunks costs amortised O(1).
        if self.tail.len() > 2 * self.tail_cap {
            let cut = self.tail.len() - self.tail_cap;
            self.tail.drain(..cut);
        }
    }

    /// Counts `n` bytes that were dropped before they reached this capture. The head is
    /// closed, so the omitted-bytes line stands where the gap was.
    pub fn skip(&mut self, n: u64) {
        self.total += n;
        self.head_cap = self.head.len();
    }

    /// Bytes dropped from the middle so far.
    pub fn omitted(&self) -> u64 {
        self.total - self.head.len() as u64 - self.tail.len().min(self.tail_cap) as u64
    }

    /// The kept text, lossily decoded, with a line stating how much was dropped.
    pub fn finish(self) -> (String, u64) {
        let omitted = self.omitted();
        let tail_start = self.tail.len().saturating_sub(self.tail_cap);
        let tail = &self.tail[tail_start..];
        if omitted == 0 {
            let mut all = self.head;
            all.extend_from_slice(tail);
            return (String::from_utf8_lossy(&all).into_owned(), 0);
        }
        let text = format!(
            "{}\n[... {omitted} bytes of output omitted ...]\n{}",
            String::from_utf8_lossy(&self.head),
            String::from_utf8_lossy(tail)
        );
        (text, omitted)
    }
}

/// What [`MarkerScanner::feed`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// No complete marker yet.
    Pending,
    /// A complete marker: its payload (the text between the token and the terminator),
    /// and the bytes that followed it in the stream.
    Found {
        /// The marker's payload, e.g. an exit status.
        payload: String,
        /// Bytes after the marker, which belong to whatever comes next.
        rest: Vec<u8>,
    },
}

/// Terminates a marker: ASCII "record separator", which commands practically never print.
pub const MARKER_END: u8 = 0x1e;

/// Finds `<RS><token>:<payload><RS>` in a chunked stream, forwarding all other bytes.
#[derive(Debug)]
pub struct MarkerScanner {
    prefix: Vec<u8>,
    pending: Vec<u8>,
    max_payload: usize,
}

impl MarkerScanner {
    /// A scanner for the marker carrying `token`.
    pub fn new(token: &str) -> Self {
        let mut prefix = vec![MARKER_END];
        prefix.extend_from_slice(token.as_bytes());
        prefix.push(b':');
        MarkerScanner {
            prefix,
            pending: Vec::new(),
            max_payload: 64,
        }
    }

    /// Sets the longest payload a marker may carry (64 bytes by default, enough for
    /// sequence numbers and exit codes). A longer "marker" is treated as output.
    pub fn with_max_payload(mut self, max: usize) -> Self {
        self.max_payload = max;
        self
    }

    /// Feeds a chunk; bytes that are certainly output go to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut CappedOutput) -> Scan {
        self.pending.extend_from_slice(chunk);
        if let Some(at) = memchr::memmem::find(&self.pending, &self.prefix) {
            out.push(&self.pending[..at]);
            let body = at + self.prefix.len();
            if let Some(end) = memchr::memchr(MARKER_END, &self.pending[body..]) {
                let payload = String::from_utf8_lossy(&self.pending[body..body + end]).into_owned();
                let rest = self.pending[body + end + 1..].to_vec();
                self.pending.clear();
                return Scan::Found { payload, rest };
            }
            self.pending.drain(..at);
            // A "marker" whose payload runs past the limit was not ours: pass its first
            // byte through and look again from the next.
            if self.pending.len() > self.prefix.len() + self.max_payload {
                out.push(&self.pending[..1]);
                self.pending.drain(..1);
                return self.feed(&[], out);
            }
            return Scan::Pending;
        }
        // Keep only what could be the start of a marker split across chunks.
        let keep = (self.prefix.len() - 1).min(self.pending.len());
        let emit = self.pending.len() - keep;
        out.push(&self.pending[..emit]);
        self.pending.drain(..emit);
        Scan::Pending
    }

    /// Flushes held-back bytes (when giving up on the marker).
    pub fn flush(&mut self, out: &mut CappedOutput) {
        out.push(&self.pending);
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut o = CappedOutput::new(100);
        o.push(b"hello ");
        o.push(b"world");
        assert_eq!(o.finish(), ("hello world".to_string(), 0));
    }

    #[test]
    fn large_output_keeps_head_and_tail_and_counts_the_rest() {
        let mut o = CappedOutput::new(10);
        for _ in 0..1000 {
            o.push(b"0123456789");
        }
        let (text, omitted) = o.finish();
        assert_eq!(omitted, 10_000 - 10);
        assert!(text.starts_with("01234\n[... 9990 bytes"), "{text}");
        assert!(text.ends_with("56789"), "{text}");
    }

    #[test]
    fn marker_split_across_chunks_is_found() {
        let mut s = MarkerScanner::new("tok");
        let mut o = CappedOutput::new(1000);
        let stream = b"line one\nline two\x1etok:17\x1eafter";
        let mut found = None;
        for chunk in stream.chunks(3) {
            if let Scan::Found { payload, rest } = s.feed(chunk, &mut o) {
                found = Some((payload, rest));
                break;
            }
        }
        let (payload, _rest) = found.expect("marker");
        assert_eq!(payload, "17");
        assert_eq!(o.finish().0, "line one\nline two");
    }

    #[test]
    fn other_tokens_pass_through() {
        let mut s = MarkerScanner::new("tok");
        let mut o = CappedOutput::new(1000);
        assert_eq!(s.feed(b"a\x1eother:1\x1eb", &mut o), Scan::Pending);
        s.flush(&mut o);
        assert_eq!(o.finish().0, "a\x1eother:1\x1eb");
    }
}
