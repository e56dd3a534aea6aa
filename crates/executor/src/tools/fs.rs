//! `fs.read`, `fs.write` and `fs.list`, confined to the agent's workspace. Every path is
//! relative; absolute paths, `..`, URL-encoded dots or slashes and NUL bytes are refused before
//! the file system is touched, and the resolved path (symlinks followed) must stay inside the
//! workspace. Only regular files are read: a FIFO, socket, device or directory is refused with
//! `INVALID_ARGUMENT` before any byte is read (the file is opened non-blocking and checked with
//! `fstat`, so a FIFO cannot block the open), and so is a file over the size limit.

use std::path::{Component, Path, PathBuf};

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

/// Largest file `fs.read` returns and `fs.write` writes. Outputs over the inline limit travel as
/// artifacts, so this bounds the agent's memory, not message sizes.
const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;
/// Most entries `fs.list` returns.
const MAX_ENTRIES: usize = 1000;

fn denied(path: &str, why: &str) -> ToolError {
    ToolError::invalid_argument(format!("path `{}` is denied: {why}", path.escape_default()))
}

/// Checks the text of a path before it is used: relative, no `..`, nothing encoded.
fn check_text(relative: &str) -> Result<&Path, ToolError> {
    if relative.contains('\0') {
        return Err(denied(relative, "it contains a NUL byte"));
    }
    let lower = relative.to_ascii_lowercase();
    if ["%2e", "%2f", "%5c", "%00"].iter().any(|enc| lower.contains(enc)) {
        return Err(denied(relative, "URL-encoded dots, slashes or NUL are not allowed"));
    }
    if relative.contains('\\') {
        return Err(denied(relative, "backslashes are not allowed"));
    }
    let path = Path::new(relative);
    if path.is_absolute() {
        return Err(denied(relative, "absolute paths are not allowed"));
    }
    if path.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(denied(relative, "it leaves the workspace"));
    }
    Ok(path)
}

fn root(workspace: &Path) -> Result<PathBuf, ToolError> {
    workspace
        .canonicalize()
        .map_err(|e| ToolError::failed(format!("workspace {} is unusable: {e}", workspace.display())))
}

/// Resolves an existing path inside the workspace, following symlinks.
pub(crate) fn confine(workspace: &Path, relative: &str) -> Result<PathBuf, ToolError> {
    let path = check_text(relative)?;
    let root = root(workspace)?;
    let resolved = root
        .join(path)
        .canonicalize()
        .map_err(|e| ToolError::invalid_argument(format!("path `{relative}`: {e}")))?;
    if !resolved.starts_with(&root) {
        return Err(denied(relative, "it resolves outside the workspace"));
    }
    Ok(resolved)
}

/// Resolves a path to write: its directory must exist inside the workspace, and an existing
/// file there must not be a symlink out of it.
fn confine_for_write(workspace: &Path, relative: &str) -> Result<PathBuf, ToolError> {
    let path = check_text(relative)?;
    let root = root(workspace)?;
    let file_name = path.file_name().ok_or_else(|| denied(relative, "it names no file"))?;
    let parent = root.join(path.parent().unwrap_or(Path::new(""))).canonicalize().map_err(|e| {
        ToolError::invalid_argument(format!("path `{relative}`: its directory does not exist: {e}"))
    })?;
    if !parent.starts_with(&root) {
        return Err(denied(relative, "its directory resolves outside the workspace"));
    }
    let target = parent.join(file_name);
    if let Ok(meta) = std::fs::symlink_metadata(&target)
        && meta.file_type().is_symlink()
    {
        let resolved =
            target.canonicalize().map_err(|e| ToolError::invalid_argument(format!("{relative}: {e}")))?;
        if !resolved.starts_with(&root) {
            return Err(denied(relative, "it is a symlink out of the workspace"));
        }
    }
    Ok(target)
}

/// Opens a confined path for reading, refusing anything but a regular file of at most `max`
/// bytes, before reading it. Returns the file and its size.
pub(crate) fn open_regular(path: &Path, shown: &str, max: u64) -> Result<(std::fs::File, u64), ToolError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOCTTY).bits())
        .open(path)
        .map_err(|e| ToolError::invalid_argument(format!("{}: {e}", shown.escape_default())))?;
    let meta = file.metadata().map_err(|e| ToolError::invalid_argument(format!("{shown}: {e}")))?;
    let kind = meta.file_type();
    let not = |what: &str| {
        Err(ToolError::invalid_argument(format!(
            "{} is {what}, not a regular file; only regular files can be read",
            shown.escape_default()
        )))
    };
    if kind.is_dir() {
        return not("a directory");
    } else if kind.is_fifo() {
        return not("a FIFO");
    } else if kind.is_socket() {
        return not("a socket");
    } else if kind.is_block_device() || kind.is_char_device() {
        return not("a device");
    } else if !kind.is_file() {
        return not("a special file");
    }
    if meta.len() > max {
        return Err(ToolError::invalid_argument(format!(
            "{} is {} bytes, over the limit of {max}",
            shown.escape_default(),
            meta.len()
        )));
    }
    Ok((file, meta.len()))
}

/// Reads a confined regular file of at most `max` bytes (see [`open_regular`]); a file that grows
/// while it is read is cut off at `max` and refused.
pub(crate) fn read_regular(path: &Path, shown: &str, max: u64) -> Result<Vec<u8>, ToolError> {
    use std::io::Read;
    let (file, size) = open_regular(path, shown, max)?;
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ToolError::invalid_argument(format!("{}: {e}", shown.escape_default())))?;
    if bytes.len() as u64 > max {
        return Err(ToolError::invalid_argument(format!("{shown} grew past the limit of {max} bytes")));
    }
    Ok(bytes)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    /// File path relative to the workspace.
    path: String,
}

pub struct FsRead;

impl Tool for FsRead {
    fn name(&self) -> &'static str {
        "fs.read"
    }
    fn description(&self) -> &'static str {
        "Reads a UTF-8 text file from the workspace (at most 64 MiB); returns {path, size, text}."
    }
    fn params_schema(&self) -> Value {
        schema_of::<ReadArgs>()
    }
    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: ReadArgs = parse_args(args)?;
            let path = confine(&ctx.workspace, &args.path)?;
            // Reading and checking up to 64 MiB is blocking work: keep it off the async workers.
            crate::isolate::cpu(move || {
                let bytes = read_regular(&path, &args.path, MAX_FILE_BYTES as u64)?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| ToolError::invalid_argument(format!("{} is not UTF-8 text", args.path)))?;
                Ok(json!({"path": args.path, "size": text.len(), "text": text}))
            })
            .await?
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    /// File path relative to the workspace; its directory must exist.
    path: String,
    /// The text to write.
    content: String,
    /// Append instead of replacing.
    #[serde(default)]
    append: bool,
}

pub struct FsWrite;

impl Tool for FsWrite {
    fn name(&self) -> &'static str {
        "fs.write"
    }
    fn description(&self) -> &'static str {
        "Writes (or appends) UTF-8 text to a file in the workspace; returns {path, bytes_written}."
    }
    fn params_schema(&self) -> Value {
        schema_of::<WriteArgs>()
    }
    fn side_effects(&self) -> bool {
        true
    }
    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: WriteArgs = parse_args(args)?;
            if args.content.len() > MAX_FILE_BYTES {
                return Err(ToolError::invalid_argument(format!(
                    "content is {} bytes, over {MAX_FILE_BYTES}",
                    args.content.len()
                )));
            }
            let path = confine_for_write(&ctx.workspace, &args.path)?;
            let write = async {
                use tokio::io::AsyncWriteExt;
                let mut file = tokio::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(args.append)
                    .truncate(!args.append)
                    .open(&path)
                    .await?;
                file.write_all(args.content.as_bytes()).await?;
                file.flush().await
            };
            write.await.map_err(|e| ToolError::failed(format!("{}: {e}", args.path)))?;
            Ok(json!({"path": args.path, "bytes_written": args.content.len()}))
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    /// Directory relative to the workspace; `.` is the workspace itself.
    #[serde(default = "here")]
    path: String,
}

fn here() -> String {
    ".".to_owned()
}

pub struct FsList;

impl Tool for FsList {
    fn name(&self) -> &'static str {
        "fs.list"
    }
    fn description(&self) -> &'static str {
        "Lists a directory of the workspace; returns {path, entries:[{name, kind, size}]} sorted by name."
    }
    fn params_schema(&self) -> Value {
        schema_of::<ListArgs>()
    }
    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: ListArgs = parse_args(args)?;
            let dir = confine(&ctx.workspace, &args.path)?;
            let mut reader = tokio::fs::read_dir(&dir)
                .await
                .map_err(|e| ToolError::invalid_argument(format!("{}: {e}", args.path)))?;
            let mut entries = Vec::new();
            while let Some(entry) = reader.next_entry().await.map_err(|e| ToolError::failed(e.to_string()))? {
                let meta = entry.metadata().await.map_err(|e| ToolError::failed(e.to_string()))?;
                let kind = if meta.is_dir() {
                    "dir"
                } else if meta.is_symlink() {
                    "symlink"
                } else {
                    "file"
                };
                entries.push(
                    json!({"name": entry.file_name().to_string_lossy(), "kind": kind, "size": meta.len()}),
                );
                if entries.len() >= MAX_ENTRIES {
                    break;
                }
            }
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Ok(json!({"path": args.path, "entries": entries}))
        })
    }
}
