//! The one way sparkrt opens the files a user hands it (configs, profiles,
//! tokenizer files, safetensors headers and shards): regular files only,
//! and small ones read with a byte limit.
//!
//! A FIFO named `config.json` would block `open` (and then `read`) forever,
//! a device could stream without end, and a directory is not a file. So the
//! file is opened with `O_NONBLOCK` (a FIFO then opens at once instead of
//! waiting for a writer; reads of a regular file ignore the flag), then
//! `fstat`ed, and anything but a regular file is refused. Checking the open
//! descriptor, not the path, leaves no window for the path to be swapped
//! between the check and the read. Rust opens with `O_CLOEXEC` already.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// A path that is not a regular file (the payload of the `io::Error`).
#[derive(Debug)]
pub struct NotRegularFile {
    pub kind: &'static str,
}

impl fmt::Display for NotRegularFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "is {}, not a regular file", self.kind)
    }
}

impl std::error::Error for NotRegularFile {}

/// A file larger than its reader accepts (the payload of the `io::Error`).
#[derive(Debug)]
pub struct FileTooLarge {
    pub bytes: u64,
    pub limit: u64,
}

impl fmt::Display for FileTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "is {} bytes, above the limit of {} bytes for this file",
            self.bytes, self.limit
        )
    }
}

impl std::error::Error for FileTooLarge {}

/// Opens `path` for reading if it is a regular file (symlinks followed).
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let file_type = file.metadata()?.file_type();
    if file_type.is_file() {
        return Ok(file);
    }
    let kind = if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else {
        "not a file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        NotRegularFile { kind },
    ))
}

/// Reads the regular file `path`, refusing one over `limit` bytes (checked
/// on the size before reading, and on what is read, should it grow).
pub fn read_regular(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let len = file.metadata()?.len();
    let too_large =
        |bytes| io::Error::new(io::ErrorKind::InvalidData, FileTooLarge { bytes, limit });
    if len > limit {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, limit)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_directories_fifos_and_devices_and_large_files() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_regular(dir.path(), 10).unwrap_err();
        assert_eq!(err.to_string(), "is a directory, not a regular file");

        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: c_path is a valid NUL-terminated string for the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = read_regular(&fifo, 10).unwrap_err();
        assert_eq!(err.to_string(), "is a FIFO, not a regular file");

        let err = read_regular(Path::new("/dev/zero"), 10).unwrap_err();
        assert_eq!(err.to_string(), "is a character device, not a regular file");

        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"12345");
        let err = read_regular(&file, 4).unwrap_err();
        assert!(err.get_ref().unwrap().is::<FileTooLarge>(), "{err}");
        assert_eq!(read_regular_to_string(&file, 5).unwrap(), "12345");
    }
}
