//! The operating system's randomness, for what must not be guessed: the directory's keys,
//! the SSD regions' fill nonces.

/// Fills `bytes` from the OS's random source (`getrandom`); where the kernel cannot give
/// them (a seccomp profile that forbids the call), from std's per-process random hasher
/// keys mixed with the clock: never predictable from values handed out before.
pub fn fill(bytes: &mut [u8]) {
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: `rest` is valid for `rest.len()` bytes of writes for the call's duration.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(got) {
            Ok(got) if got > 0 => filled += got,
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    for chunk in bytes[filled..].chunks_mut(8) {
        let word = fallback_word().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Eight random bytes ([`fill`]).
pub fn u64() -> u64 {
    let mut bytes = [0; 8];
    fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

fn fallback_word() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |time| time.as_nanos()),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    #[test]
    fn draws_differ_and_fill_every_byte() {
        assert_ne!(super::u64(), super::u64());
        // 64 bytes all zero after a fill happens with probability 2^-512.
        let mut bytes = [0u8; 64];
        super::fill(&mut bytes);
        assert!(bytes.iter().any(|byte| *byte != 0));
        let mut odd = [0u8; 13];
        super::fill(&mut odd);
        assert!(odd[8..].iter().any(|byte| *byte != 0));
    }
}
