//! Sealed control-plane frames (docs/worker-protocol.md, "Sealing"): every
//! frame between the gateway and a node agent is ChaCha20-Poly1305 under a
//! key derived per session from the cluster's pre-shared key, so only a peer
//! holding that key can be heard. A frame that does not open (another key,
//! altered, another session) or that comes again (a counter not above the
//! last one opened) is refused. The Python twin is
//! `python/tiertp/worker/seal.py`: the same bytes both ways (a fixed test
//! vector in both test suites).
//!
//! The zeromq crate has no CURVE, hence an AEAD over a pre-shared key rather
//! than ZeroMQ's own handshake.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce};
use hkdf::Hkdf;
use sha2::Sha256;
use thiserror::Error;

pub const KEY_BYTES: usize = 32;
pub const SESSION_BYTES: usize = 16;
/// version, direction, session id, session start (ms), counter.
pub const HEADER_BYTES: usize = 2 + SESSION_BYTES + 8 + 8;
const TAG_BYTES: usize = 16;
const VERSION: u8 = 1;
/// HKDF's `info`: the session key is for this protocol and version only.
const KDF_INFO: &[u8] = b"tiertp control v1";

/// The pre-shared control-plane key. Its `Debug` never shows it, so a config
/// holding one can be printed.
#[derive(Clone)]
pub struct ControlKey([u8; KEY_BYTES]);

impl ControlKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SealError> {
        let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| SealError::KeyLength(bytes.len()))?;
        Ok(Self(key))
    }

    /// A fresh key from the OS's random source (the mock agent's, tests').
    pub fn random() -> Self {
        Self(random_bytes())
    }
}

impl fmt::Debug for ControlKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ControlKey(<redacted>)")
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // Without randomness no session could be told apart from another: nothing to go on with.
    getrandom::fill(&mut b).expect("the OS random source failed");
    b
}

#[derive(Debug, Clone, Error, PartialEq)]
pub enum SealError {
    #[error("a control-plane key is {KEY_BYTES} bytes, got {0}")]
    KeyLength(usize),
    #[error("not a sealed frame ({0})")]
    Malformed(&'static str),
    #[error("sealed for the other direction")]
    WrongDirection,
    #[error("sealed for another session")]
    OtherSession,
    #[error("does not open under this key (another key, or altered)")]
    Unauthentic,
    #[error("replayed: counter {counter}, already at {last}")]
    Replayed { counter: u64, last: u64 },
}

/// Who sealed a frame: the byte that keeps the two directions' nonces apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    ToAgent = 1,
    ToClient = 2,
}

/// A frame's clear part, authenticated with it (the AEAD's associated data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub direction: Direction,
    pub session: [u8; SESSION_BYTES],
    /// When the client started the session (Unix ms): an agent takes a new
    /// session only if this is recent, so an old one cannot be replayed.
    pub started_ms: u64,
    pub counter: u64,
}

impl Header {
    pub fn parse(frame: &[u8]) -> Result<Self, SealError> {
        if frame.len() < HEADER_BYTES + TAG_BYTES {
            return Err(SealError::Malformed("too short"));
        }
        if frame[0] != VERSION {
            return Err(SealError::Malformed("unknown version"));
        }
        let direction = match frame[1] {
            1 => Direction::ToAgent,
            2 => Direction::ToClient,
            _ => return Err(SealError::Malformed("unknown direction")),
        };
        let u64_at = |i: usize| u64::from_be_bytes(frame[i..i + 8].try_into().expect("8 bytes"));
        Ok(Self {
            direction,
            session: frame[2..2 + SESSION_BYTES].try_into().expect("session bytes"),
            started_ms: u64_at(2 + SESSION_BYTES),
            counter: u64_at(2 + SESSION_BYTES + 8),
        })
    }

    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0] = VERSION;
        h[1] = self.direction as u8;
        h[2..2 + SESSION_BYTES].copy_from_slice(&self.session);
        h[2 + SESSION_BYTES..2 + SESSION_BYTES + 8].copy_from_slice(&self.started_ms.to_be_bytes());
        h[2 + SESSION_BYTES + 8..].copy_from_slice(&self.counter.to_be_bytes());
        h
    }

    /// Direction and counter: unique per frame under the session's own key.
    fn nonce(&self) -> Nonce {
        let mut n = [0u8; 12];
        n[0] = self.direction as u8;
        n[4..].copy_from_slice(&self.counter.to_be_bytes());
        Nonce::from(n)
    }
}

/// One connection's session: its id, start and key (HKDF-SHA256 of the
/// pre-shared key, salted with the id). Each direction gets a `Sealer` and
/// an `Opener`.
#[derive(Clone)]
pub struct Session {
    aead: ChaCha20Poly1305,
    id: [u8; SESSION_BYTES],
    started_ms: u64,
}

impl Session {
    /// A client's new session: a random id, started now.
    pub fn start(key: &ControlKey) -> Self {
        let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Self::with_id(key, random_bytes(), started_ms)
    }

    /// The session a client started, as named by one of its frames (an agent's side).
    pub fn join(key: &ControlKey, header: &Header) -> Self {
        Self::with_id(key, header.session, header.started_ms)
    }

    pub fn with_id(key: &ControlKey, id: [u8; SESSION_BYTES], started_ms: u64) -> Self {
        let mut session_key = [0u8; KEY_BYTES];
        Hkdf::<Sha256>::new(Some(&id), &key.0)
            .expand(KDF_INFO, &mut session_key)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        Self {
            aead: ChaCha20Poly1305::new(&session_key.into()),
            id,
            started_ms,
        }
    }

    pub fn sealer(&self, direction: Direction) -> Sealer {
        Sealer {
            session: self.clone(),
            direction,
            next: 0,
        }
    }

    pub fn opener(&self, direction: Direction) -> Opener {
        Opener {
            session: self.clone(),
            direction,
            last: None,
        }
    }

    fn header(&self, direction: Direction, counter: u64) -> Header {
        Header {
            direction,
            session: self.id,
            started_ms: self.started_ms,
            counter,
        }
    }
}

/// Seals one direction's frames, counting from 0.
pub struct Sealer {
    session: Session,
    direction: Direction,
    next: u64,
}

impl Sealer {
    pub fn seal(&mut self, plaintext: &[u8]) -> Vec<u8> {
        let header = self.session.header(self.direction, self.next);
        self.next = self.next.checked_add(1).expect("2^64 frames in one session");
        let aad = header.encode();
        let sealed = self
            .session
            .aead
            .encrypt(&header.nonce(), Payload { msg: plaintext, aad: &aad })
            .expect("a frame within ChaCha20-Poly1305's length limit");
        let mut frame = Vec::with_capacity(HEADER_BYTES + sealed.len());
        frame.extend_from_slice(&aad);
        frame.extend_from_slice(&sealed);
        frame
    }
}

/// Opens one direction's frames: each must be of this session, authentic,
/// and counted above the last one opened.
pub struct Opener {
    session: Session,
    direction: Direction,
    last: Option<u64>,
}

impl Opener {
    pub fn open(&mut self, frame: &[u8]) -> Result<Vec<u8>, SealError> {
        let header = Header::parse(frame)?;
        if header.direction != self.direction {
            return Err(SealError::WrongDirection);
        }
        if header.session != self.session.id || header.started_ms != self.session.started_ms {
            return Err(SealError::OtherSession);
        }
        let (aad, sealed) = frame.split_at(HEADER_BYTES);
        let plaintext = self
            .session
            .aead
            .decrypt(&header.nonce(), Payload { msg: sealed, aad })
            .map_err(|_| SealError::Unauthentic)?;
        // Checked once authentic: a forged counter must not move `last`.
        if let Some(last) = self.last.filter(|&l| header.counter <= l) {
            return Err(SealError::Replayed {
                counter: header.counter,
                last,
            });
        }
        self.last = Some(header.counter);
        Ok(plaintext)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> ControlKey {
        ControlKey::from_bytes(&[byte; KEY_BYTES]).unwrap()
    }

    /// Both ends of one session, as a client and an agent hold them.
    fn pair(k: &ControlKey) -> ((Sealer, Opener), (Sealer, Opener)) {
        let client = Session::start(k);
        let mut to_agent = client.sealer(Direction::ToAgent);
        let first = to_agent.seal(b"hello");
        let agent = Session::join(k, &Header::parse(&first).unwrap());
        let mut from_client = agent.opener(Direction::ToAgent);
        assert_eq!(from_client.open(&first).unwrap(), b"hello");
        (
            (to_agent, client.opener(Direction::ToClient)),
            (agent.sealer(Direction::ToClient), from_client),
        )
    }

    #[test]
    fn frames_open_both_ways_in_one_session() {
        let k = key(7);
        let ((mut c_seal, mut c_open), (mut a_seal, mut a_open)) = pair(&k);
        for i in 0..3u8 {
            assert_eq!(a_open.open(&c_seal.seal(&[i; 5])).unwrap(), vec![i; 5]);
            assert_eq!(c_open.open(&a_seal.seal(&[i; 300])).unwrap(), vec![i; 300]);
        }
    }

    #[test]
    fn a_tampered_frame_is_refused_anywhere_it_is_changed() {
        let k = key(7);
        let ((mut c_seal, _), (_, mut a_open)) = pair(&k);
        let frame = c_seal.seal(b"{\"type\": \"stats\"}");
        for i in [1, 5, HEADER_BYTES - 1, HEADER_BYTES, frame.len() - 1] {
            let mut bad = frame.clone();
            bad[i] ^= 0x01;
            assert!(a_open.open(&bad).is_err(), "byte {i} flipped was accepted");
        }
        // The untouched frame still opens: refusals changed nothing.
        assert!(a_open.open(&frame).is_ok());
        assert_eq!(a_open.open(&frame[..10]), Err(SealError::Malformed("too short")));
    }

    #[test]
    fn a_replayed_or_reordered_frame_is_refused() {
        let k = key(7);
        let ((mut c_seal, _), (_, mut a_open)) = pair(&k);
        let (one, two) = (c_seal.seal(b"1"), c_seal.seal(b"2"));
        assert!(a_open.open(&two).is_ok());
        assert_eq!(a_open.open(&two), Err(SealError::Replayed { counter: 2, last: 2 }));
        assert_eq!(a_open.open(&one), Err(SealError::Replayed { counter: 1, last: 2 }));
    }

    #[test]
    fn another_key_another_session_or_the_other_direction_does_not_open() {
        let k = key(7);
        let ((mut c_seal, mut c_open), (_, mut a_open)) = pair(&k);
        let mut stranger = Session::start(&key(8)).sealer(Direction::ToAgent);
        let forged = stranger.seal(b"{\"type\": \"apply_plan\"}");
        let mut joined = Session::join(&k, &Header::parse(&forged).unwrap()).opener(Direction::ToAgent);
        assert_eq!(joined.open(&forged), Err(SealError::Unauthentic));
        assert_eq!(a_open.open(&forged), Err(SealError::OtherSession));
        // A client's own frame reflected back to it is not an agent's.
        assert_eq!(c_open.open(&c_seal.seal(b"x")), Err(SealError::WrongDirection));
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let k = ControlKey::from_bytes(&[0xab; KEY_BYTES]).unwrap();
        let shown = format!("{k:?} {:?}", Some(k.clone()));
        assert!(!shown.contains("ab") && !shown.contains("171"), "{shown}");
        assert!(shown.contains("<redacted>"));
        assert_eq!(ControlKey::from_bytes(&[1; 31]).unwrap_err(), SealError::KeyLength(31));
    }

    /// The frame `tests/test_control_seal.py` expects too: both languages
    /// seal the same bytes, so each opens the other's.
    const VECTOR_FRAME: &str = concat!(
        "0101000102030405060708090a0b0c0d0e0f0000018f4df73e000000000000000005",
        "3ccf2d979264bcf1b9ae1ca986d8f5a5bf4c0b8cc1300d6d88b410"
    );

    #[test]
    fn the_cross_language_test_vector() {
        let k = ControlKey::from_bytes(&(0u8..32).collect::<Vec<_>>()).unwrap();
        let id: [u8; SESSION_BYTES] = core::array::from_fn(|i| i as u8);
        let session = Session::with_id(&k, id, 1_715_000_000_000);
        let mut sealer = session.sealer(Direction::ToAgent);
        sealer.next = 5;
        let frame = sealer.seal(b"\x81\xa4type\xa4ping");
        let hex: String = frame.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, VECTOR_FRAME);
        assert_eq!(session.opener(Direction::ToAgent).open(&frame).unwrap(), b"\x81\xa4type\xa4ping");
    }
}
