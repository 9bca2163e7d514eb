//! What a release needs to know of an ELF file's header: its machine, and whether it asks for
//! a dynamic loader (a PT_INTERP program header).

use std::{fs, path::Path};

use anyhow::{ensure, Context, Result};

pub struct Header {
    /// `e_machine`: 62 x86_64, 183 aarch64.
    pub machine: u16,
    /// Whether it has a PT_INTERP program header.
    pub interpreter: bool,
}

impl Header {
    pub fn read(file: &Path) -> Result<Self> {
        let elf = fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
        Self::parse(&elf).with_context(|| format!("{} is not an ELF executable", file.display()))
    }

    /// A 64-bit little-endian ELF file's header and program headers.
    fn parse(elf: &[u8]) -> Result<Self> {
        let word = |at: u64, len: usize| -> Result<u64> {
            let at = usize::try_from(at)?;
            let bytes = elf.get(at..at + len).context("truncated ELF header")?;
            Ok(bytes.iter().rev().fold(0, |v, &b| (v << 8) | u64::from(b)))
        };
        ensure!(
            elf.starts_with(b"\x7fELF") && elf.get(4) == Some(&2) && elf.get(5) == Some(&1),
            "not a 64-bit little-endian ELF file"
        );
        let machine = u16::try_from(word(0x12, 2)?)?;
        let (phoff, phentsize, phnum) = (word(0x20, 8)?, word(0x36, 2)?, word(0x38, 2)?);
        let mut interpreter = false;
        for i in 0..phnum {
            const PT_INTERP: u64 = 3;
            interpreter |= word(phoff + i * phentsize, 4)? == PT_INTERP;
        }
        Ok(Self {
            machine,
            interpreter,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_read_as_what_it_is() {
        let me = std::env::current_exe().unwrap();
        let header = Header::read(&me).unwrap();
        let machine = match std::env::consts::ARCH {
            "x86_64" => 62,
            "aarch64" => 183,
            other => panic!("no ELF machine known for {other}"),
        };
        assert_eq!(header.machine, machine);
        // cargo test builds for the host's glibc: dynamically linked.
        assert!(header.interpreter);
    }

    #[test]
    fn a_file_that_is_not_elf_is_an_error_not_a_panic() {
        assert!(Header::parse(b"#!/bin/sh\n").is_err());
        assert!(Header::parse(b"\x7fELF\x02\x01").is_err());
    }
}
