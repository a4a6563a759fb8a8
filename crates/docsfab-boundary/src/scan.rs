//! The credential scan: known provider key shapes and the host's own secret values.
//!
//! A fixed set of prefixes is found with one Aho-Corasick pass (SIMD prefilter, so ordinary
//! text costs little); each hit is then checked against the shape of a real key, with a
//! realistic minimum length and a random-looking run, so that prose such as `task-oriented` or
//! `sk-learn` does not match. A host secret shorter than 16 bytes is an exact byte match; a
//! longer one matches on any 16-byte piece of it, so a cut or split key is still found.

use aho_corasick::{AhoCorasick, Input, MatchKind};
use memchr::memmem;
use std::sync::Arc;

use crate::verdict::CredentialKind;

/// The shortest piece of a host key that is removed wherever it appears. Any run of this many
/// bytes of a long key is treated as the key; shorter keys are removed whole.
pub const KEY_PIECE_LEN: usize = 16;

/// A secret value of the host (an API key read from the environment by the caller), with a
/// label that a refusal may show instead of it.
#[derive(Clone)]
pub struct Secret {
    label: Arc<str>,
    value: Box<[u8]>,
}

/// Secrets shorter than this would match ordinary text, so [`Secret::new`] refuses them.
pub const MIN_SECRET_LEN: usize = 8;

/// A host secret too short to scan for without matching ordinary text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretTooShort {
    pub label: String,
    pub len: usize,
}

impl std::fmt::Display for SecretTooShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the secret {} is {} bytes long; the response boundary scans only for secrets of at least {MIN_SECRET_LEN} bytes",
            self.label, self.len
        )
    }
}

impl std::error::Error for SecretTooShort {}

impl Secret {
    /// `label` names the secret in refusals (e.g. `OPENAI_API_KEY`); `value` is never shown.
    /// The same label and value.
    pub(crate) fn same_as(&self, other: &Secret) -> bool {
        self.label == other.label && self.value == other.value
    }

    pub fn new(label: &str, value: impl AsRef<[u8]>) -> Result<Self, SecretTooShort> {
        let value = value.as_ref();
        if value.len() < MIN_SECRET_LEN {
            return Err(SecretTooShort {
                label: label.to_owned(),
                len: value.len(),
            });
        }
        Ok(Self {
            label: label.into(),
            value: value.into(),
        })
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn value(&self) -> &[u8] {
        &self.value
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("label", &self.label)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// The prefixes, in pattern-id order, with the shape check each hit must pass.
const PREFIXES: &[(&str, Shape)] = &[
    ("sk-", Shape::SkKey),
    ("nvapi-", Shape::Nvidia),
    ("AKIA", Shape::Aws),
    ("ASIA", Shape::Aws),
    ("ghp_", Shape::GitHubClassic),
    ("gho_", Shape::GitHubClassic),
    ("ghs_", Shape::GitHubClassic),
    ("ghu_", Shape::GitHubClassic),
    ("ghr_", Shape::GitHubClassic),
    ("github_pat_", Shape::GitHubPat),
    ("-----BEGIN ", Shape::Pem),
];

#[derive(Debug, Clone, Copy)]
enum Shape {
    SkKey,
    Nvidia,
    Aws,
    GitHubClassic,
    GitHubPat,
    Pem,
}

/// The compiled scan: built once per configuration, shared by every body checked with it.
pub(crate) struct Scanner {
    prefixes: AhoCorasick,
    /// Host secrets shorter than [`KEY_PIECE_LEN`], matched whole.
    secrets: Vec<(Arc<str>, memmem::Finder<'static>)>,
    /// Every [`KEY_PIECE_LEN`]-byte piece of the longer host secrets, and the label of the
    /// secret each pattern came from: a body that carries part of a long key (cut, or split
    /// across fields) carries key material all the same.
    pieces: Option<(AhoCorasick, Vec<Arc<str>>)>,
}

impl std::fmt::Debug for Scanner {
    /// Never the patterns: they are the host's secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("host_secrets", &self.secrets.len())
            .field(
                "host_secret_pieces",
                &self.pieces.as_ref().map_or(0, |(_, l)| l.len()),
            )
            .finish()
    }
}

impl Scanner {
    pub(crate) fn new(secrets: &[Secret]) -> Result<Self, aho_corasick::BuildError> {
        let prefixes = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(PREFIXES.iter().map(|(p, _)| p))?;
        let (short, long): (Vec<&Secret>, Vec<&Secret>) =
            secrets.iter().partition(|s| s.value.len() < KEY_PIECE_LEN);
        let mut windows: Vec<(&[u8], Arc<str>)> = long
            .iter()
            .flat_map(|s| s.value.windows(KEY_PIECE_LEN).map(|w| (w, s.label.clone())))
            .collect();
        // One pattern per distinct piece; the first secret that has it names it.
        windows.sort_by(|a, b| a.0.cmp(b.0));
        windows.dedup_by(|a, b| a.0 == b.0);
        let pieces = if windows.is_empty() {
            None
        } else {
            let automaton = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostFirst)
                .build(windows.iter().map(|(w, _)| w))?;
            Some((automaton, windows.into_iter().map(|(_, l)| l).collect()))
        };
        Ok(Self {
            prefixes,
            secrets: short
                .iter()
                .map(|s| (s.label.clone(), memmem::Finder::new(&s.value).into_owned()))
                .collect(),
            pieces,
        })
    }

    /// The earliest offset in `buf` where a credential could start that bytes appended to
    /// `buf` might still complete or change. Everything before it has had its final answer, so
    /// a rolling window need keep only the byte before it (for the word-boundary check) and
    /// what follows.
    pub(crate) fn live_from(&self, buf: &[u8]) -> usize {
        let len = buf.len();
        // Token-shaped keys are all token bytes from their first byte on, and look no further
        // than TOKEN_LOOKAHEAD past their prefix.
        let token_run = buf
            .iter()
            .rev()
            .take(LONGEST_PREFIX + TOKEN_LOOKAHEAD)
            .take_while(|b| is_token_byte(**b))
            .count();
        let mut live = len - token_run;
        // A PEM header, whole or cut at the end, still waiting for its key material.
        let lo = len.saturating_sub(PEM_REACH);
        if let Some(i) = memmem::find(&buf[lo..], PEM_HEADER) {
            live = live.min(lo + i);
        } else if let Some(k) = (1..PEM_HEADER.len())
            .rev()
            .find(|k| buf.ends_with(&PEM_HEADER[..*k]))
        {
            live = live.min(len - k);
        }
        // A piece of a long host secret that more bytes could complete.
        if self.pieces.is_some() {
            live = live.min(len.saturating_sub(KEY_PIECE_LEN - 1));
        }
        // A host secret whose first bytes end the buffer.
        for (_, finder) in &self.secrets {
            let secret = finder.needle();
            let lo = len.saturating_sub(secret.len().saturating_sub(1));
            if let Some(i) = (lo..live).find(|i| secret.starts_with(&buf[*i..])) {
                live = i;
            }
        }
        live
    }

    /// The first credential in `hay`, as (offset in `hay`, kind). `hay_starts_clean` says whether
    /// the byte before `hay` (if any) is known not to be part of a token: when false, a hit at
    /// offset 0 is not taken as a key start.
    pub(crate) fn find(
        &self,
        hay: &[u8],
        hay_starts_clean: bool,
    ) -> Option<(usize, CredentialKind)> {
        let mut best: Option<(usize, CredentialKind)> = None;
        let mut from = 0;
        // Leftmost hits in order; after one that is not a key, resume one byte later (not after
        // the hit), so a prefix overlapping a failed one, as in `sk-----BEGIN`, is still seen.
        while let Some(m) = self.prefixes.find(Input::new(hay).range(from..)) {
            let start = m.start();
            from = start + 1;
            if start == 0 && !hay_starts_clean {
                continue;
            }
            let shape = PREFIXES[m.pattern().as_usize()].1;
            if let Some(kind) = check_shape(shape, hay, start, m.end()) {
                best = Some((start, kind));
                break;
            }
        }
        for (label, finder) in &self.secrets {
            if let Some(at) = finder.find(hay)
                && best.as_ref().is_none_or(|(b, _)| at < *b)
            {
                best = Some((at, CredentialKind::HostSecret(label.clone())));
            }
        }
        if let Some((automaton, labels)) = &self.pieces
            && let Some(m) = automaton.find(hay)
            && best.as_ref().is_none_or(|(b, _)| m.start() < *b)
        {
            let label = labels[m.pattern().as_usize()].clone();
            best = Some((m.start(), CredentialKind::HostSecret(label)));
        }
        best
    }
}

const TOKEN_LOOKAHEAD: usize = 256;
const LONGEST_PREFIX: usize = 11;
const PEM_HEADER: &[u8] = b"-----BEGIN ";
/// How far past its first byte a PEM match looks: header, label, dashes, material window.
const PEM_REACH: usize = PEM_HEADER.len() + 64 + 5 + 256;

/// Bytes that may continue a token: a key is not a key when glued to a longer word.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn check_shape(shape: Shape, hay: &[u8], start: usize, end: usize) -> Option<CredentialKind> {
    let glued = start > 0 && is_token_byte(hay[start - 1]);
    let tail = &hay[end..];
    match shape {
        Shape::SkKey if !glued => {
            if let Some(rest) = tail.strip_prefix(b"ant-") {
                random_token(rest, is_token_byte, 32).then_some(CredentialKind::AnthropicKey)
            } else {
                random_token(tail, is_token_byte, 32).then_some(CredentialKind::OpenAiKey)
            }
        }
        Shape::Nvidia if !glued => {
            random_token(tail, is_token_byte, 40).then_some(CredentialKind::NvidiaKey)
        }
        Shape::Aws if !(start > 0 && hay[start - 1].is_ascii_alphanumeric()) => {
            let body = tail.get(..16)?;
            let exact = body
                .iter()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
                && !tail.get(16).is_some_and(|b| b.is_ascii_alphanumeric());
            exact.then_some(CredentialKind::AwsAccessKeyId)
        }
        Shape::GitHubClassic if !glued => random_token(tail, |b| b.is_ascii_alphanumeric(), 30)
            .then_some(CredentialKind::GitHubToken),
        Shape::GitHubPat if !glued => {
            random_token(tail, |b| b.is_ascii_alphanumeric() || b == b'_', 40)
                .then_some(CredentialKind::GitHubToken)
        }
        Shape::Pem => pem_block(tail).then_some(CredentialKind::PemPrivateKey),
        _ => None,
    }
}

/// Whether `tail` starts with at least `min_len` bytes of the key alphabet that contain a run
/// of 16 or more letters and digits with at least one of each, as random key material does and
/// hyphenated prose does not.
fn random_token(tail: &[u8], in_alphabet: impl Fn(u8) -> bool, min_len: usize) -> bool {
    // Looking further than this cannot change the answer, and keeps every hit's check bounded
    // (a line of `sk-sk-sk-...` must not cost quadratic time).
    let tail = &tail[..tail.len().min(TOKEN_LOOKAHEAD)];
    let len = tail.iter().take_while(|b| in_alphabet(**b)).count();
    if len < min_len {
        return false;
    }
    tail[..len]
        .split(|b| !b.is_ascii_alphanumeric())
        .any(|run| {
            run.len() >= 16
                && run.iter().any(u8::is_ascii_digit)
                && run.iter().any(u8::is_ascii_alphabetic)
        })
}

/// After `-----BEGIN `: an upper-case label ending in `PRIVATE KEY` (or `PRIVATE KEY BLOCK`),
/// `-----`, and within the next 256 bytes a run of 40 or more base64 bytes, as every line of key
/// material is and no word of prose is. A header alone, as documentation shows it, is not a key.
fn pem_block(tail: &[u8]) -> bool {
    let label_len = tail
        .iter()
        .take(64)
        .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b' ')
        .count();
    let label = &tail[..label_len];
    if !(label.ends_with(b"PRIVATE KEY") || label.ends_with(b"PRIVATE KEY BLOCK")) {
        return false;
    }
    let Some(body) = tail[label_len..].strip_prefix(b"-----") else {
        return false;
    };
    body[..body.len().min(256)]
        .split(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')))
        .any(|run| run.len() >= 40)
}

/// Where a credential that [`Scanner::find`] reported at `start` ends, for redaction: the end
/// of its token run, or for a PEM block the end of its `-----END ...-----` line (the whole rest
/// of `hay` when that is missing, since the key material runs on).
pub(crate) fn credential_end(hay: &[u8], start: usize, kind: &CredentialKind) -> usize {
    match kind {
        CredentialKind::PemPrivateKey => {
            let Some(end) = memmem::find(&hay[start..], b"-----END ") else {
                return hay.len();
            };
            let after = start + end + b"-----END ".len();
            match memmem::find(&hay[after..], b"-----") {
                Some(dashes) => after + dashes + b"-----".len(),
                None => hay.len(),
            }
        }
        _ => {
            start
                + hay[start..]
                    .iter()
                    .take_while(|b| is_token_byte(**b))
                    .count()
        }
    }
}
