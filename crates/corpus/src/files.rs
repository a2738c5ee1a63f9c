//! Writing a corpus's files: atomically (a temporary name, then a rename, so a reader never sees
//! half a manifest or report), as pretty JSON, and hex digests.

use std::path::Path;

use serde::Serialize;

use crate::error::{io, CorpusError};

pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CorpusError> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("serialises")
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
