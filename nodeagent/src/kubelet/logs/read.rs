//! Reading a container run's log files for `kubectl logs`: the rotated files (oldest first),
//! then the current one, through [`LogWriter`]; with `follow`, the current file is polled
//! every [`FOLLOW_POLL`] while it has nothing new.

use super::cri_log::{Flow, LogOptions, LogWriter, tail_start};
use std::{
    future::Future,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncSeekExt as _, BufReader},
    sync::mpsc,
};

/// How often a followed file that has nothing new is looked at again.
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// How many idle polls pass between two checks that the container still runs.
const RUNNING_CHECK_EVERY: u32 = 4;
/// Output is sent in chunks of about this size (and at once when the file has nothing more).
const CHUNK: usize = 32 << 10;

/// The suffix a rotated file gets after `<attempt>.log.`: the kubelet's `20060102-150405`.
pub fn is_rotation_suffix(suffix: &str) -> bool {
    let b = suffix.as_bytes();
    b.len() == 15 && b[8] == b'-' && b.iter().enumerate().all(|(i, c)| i == 8 || c.is_ascii_digit())
}

/// The rotated files of the log at `path` (`<path>.<timestamp>`), oldest first.
pub fn rotated_files(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let prefix = format!("{name}.");
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().and_then(|n| n.strip_prefix(&prefix)).is_some_and(is_rotation_suffix))
        .map(|e| e.path())
        .collect();
    rotated.sort();
    rotated
}

/// Where reading starts: which of `files` and at which offset, for `tail` lines from the end.
fn start_for_tail(files: &[PathBuf], tail: u64) -> std::io::Result<(usize, u64)> {
    let mut left = tail;
    for (i, path) in files.iter().enumerate().rev() {
        let mut file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        let (offset, found) = tail_start(&mut file, len, left)?;
        if found >= left {
            return Ok((i, offset));
        }
        left -= found;
    }
    Ok((0, 0))
}

/// Sends `out` on `to` when it is large enough (or `now`); `false` when the reader is gone.
async fn flush(out: &mut Vec<u8>, to: &mpsc::Sender<bytes::Bytes>, now: bool) -> bool {
    if out.is_empty() || (!now && out.len() < CHUNK) {
        return true;
    }
    to.send(bytes::Bytes::from(std::mem::take(out))).await.is_ok()
}

/// What made reading stop early.
enum Stop {
    /// `limitBytes` is reached, or the reader went away.
    Done,
}

/// Reads records from `reader` to its end into `writer`; a last record without its newline is
/// kept in `line` (the container is still writing it) unless `whole` says the file is done.
async fn read_records<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    writer: &mut LogWriter,
    out: &mut Vec<u8>,
    to: &mpsc::Sender<bytes::Bytes>,
    whole: bool,
) -> std::io::Result<Result<(), Stop>> {
    loop {
        let n = reader.read_until(b'\n', line).await?;
        if n == 0 {
            if whole && !line.is_empty() {
                let record = std::mem::take(line);
                if writer.record(&record, out) == Flow::Done {
                    return Ok(Err(Stop::Done));
                }
            }
            return Ok(Ok(()));
        }
        if line.last() != Some(&b'\n') {
            continue; // the rest comes with the next read
        }
        line.pop();
        let record = std::mem::take(line);
        if writer.record(&record, out) == Flow::Done || !flush(out, to, false).await {
            return Ok(Err(Stop::Done));
        }
    }
}

/// Reads the log of one container run (current file `path`) as `options` say, sending the
/// output on `to`. With `follow`, it keeps reading until `running()` says the container
/// stopped, `limitBytes` is reached, or the receiver of `to` is dropped.
pub async fn read_logs<F, Fut>(
    path: &Path,
    options: &LogOptions,
    to: mpsc::Sender<bytes::Bytes>,
    mut running: F,
) -> std::io::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut files = rotated_files(path);
    files.push(path.to_path_buf());
    let (first, offset) = match options.tail {
        Some(tail) => {
            let files = files.clone();
            tokio::task::spawn_blocking(move || start_for_tail(&files, tail)).await.map_err(std::io::Error::other)??
        }
        None => (0, 0),
    };
    let mut writer = LogWriter::new(options);
    let mut out = Vec::with_capacity(CHUNK);
    let mut line = Vec::new();
    let last = files.len() - 1;
    for (i, file_path) in files.iter().enumerate().skip(first) {
        let mut file = match tokio::fs::File::open(file_path).await {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if i == first && offset > 0 {
            file.seek(std::io::SeekFrom::Start(offset)).await?;
        }
        let mut reader = BufReader::new(file);
        let whole = i != last || !options.follow;
        if read_records(&mut reader, &mut line, &mut writer, &mut out, &to, whole).await?.is_err() {
            flush(&mut out, &to, true).await;
            return Ok(());
        }
        if i == last && options.follow {
            return follow(path, reader, line, writer, out, &to, &mut running).await;
        }
    }
    writer.finish(&mut out);
    flush(&mut out, &to, true).await;
    if writer.malformed > 0 {
        tracing::warn!(file = %path.display(), skipped = writer.malformed, "records that are not CRI log records were skipped");
    }
    Ok(())
}

/// The rest of `follow`: polls the current file, which the container log manager may replace
/// (rotation) in the meantime.
async fn follow<F, Fut>(
    path: &Path,
    mut reader: BufReader<tokio::fs::File>,
    mut line: Vec<u8>,
    mut writer: LogWriter,
    mut out: Vec<u8>,
    to: &mpsc::Sender<bytes::Bytes>,
    running: &mut F,
) -> std::io::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut idle = 0u32;
    loop {
        if !flush(&mut out, to, true).await {
            return Ok(());
        }
        tokio::select! {
            _ = to.closed() => return Ok(()),
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
        }
        let before = reader.get_ref().metadata().await?.len();
        let position = reader.stream_position().await?;
        if before > position {
            idle = 0;
            if read_records(&mut reader, &mut line, &mut writer, &mut out, to, false).await?.is_err() {
                flush(&mut out, to, true).await;
                return Ok(());
            }
            continue;
        }
        // Nothing new: was the file rotated? Then what the old one still got is read, and the
        // new one followed from its start.
        let current = reader.get_ref().metadata().await?;
        if let Ok(now) = tokio::fs::metadata(path).await
            && (now.ino(), now.dev()) != (current.ino(), current.dev())
        {
            if read_records(&mut reader, &mut line, &mut writer, &mut out, to, false).await?.is_err() {
                flush(&mut out, to, true).await;
                return Ok(());
            }
            reader = BufReader::new(tokio::fs::File::open(path).await?);
            continue;
        }
        idle += 1;
        if idle.is_multiple_of(RUNNING_CHECK_EVERY) && !running().await {
            // It stopped: what it wrote last, then the end.
            if read_records(&mut reader, &mut line, &mut writer, &mut out, to, true).await?.is_ok() {
                writer.finish(&mut out);
            }
            flush(&mut out, to, true).await;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    const T: &str = "2026-12-03T16:15:34.5Z";

    async fn collect(path: &Path, options: LogOptions) -> String {
        let (tx, mut rx) = mpsc::channel(4);
        let reading = read_logs(path, &options, tx, || async { false });
        let mut text = Vec::new();
        let collecting = async {
            while let Some(chunk) = rx.recv().await {
                text.extend_from_slice(&chunk);
            }
        };
        let (read, ()) = tokio::join!(reading, collecting);
        read.unwrap();
        String::from_utf8(text).unwrap()
    }

    fn lines(from: usize, to: usize) -> String {
        (from..to).map(|i| format!("{T} stdout F line {i}\n")).collect()
    }

    #[tokio::test]
    async fn reads_rotated_files_then_the_current_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(dir.path().join("0.log.20261203-161500"), lines(0, 3)).unwrap();
        std::fs::write(dir.path().join("0.log.20261203-161510"), lines(3, 6)).unwrap();
        std::fs::write(dir.path().join("0.log.bak"), "not ours\n").unwrap();
        std::fs::write(dir.path().join("1.log"), lines(100, 101)).unwrap();
        std::fs::write(&path, lines(6, 8)).unwrap();
        let all = collect(&path, LogOptions::default()).await;
        assert_eq!(all, (0..8).map(|i| format!("line {i}\n")).collect::<String>());
        // The tail reaches into the rotated files when the current one is short.
        let tail = collect(&path, LogOptions { tail: Some(4), ..Default::default() }).await;
        assert_eq!(tail, "line 4\nline 5\nline 6\nline 7\n");
        let tail = collect(&path, LogOptions { tail: Some(100), ..Default::default() }).await;
        assert_eq!(tail, all);
        let none = collect(&dir.path().join("7.log"), LogOptions::default()).await;
        assert_eq!(none, "");
    }

    #[tokio::test]
    async fn follow_sees_new_lines_and_rotation_and_ends_with_the_container() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, lines(0, 2)).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let stopped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let running = {
            let stopped = stopped.clone();
            move || {
                let stopped = stopped.clone();
                async move { !stopped.load(std::sync::atomic::Ordering::SeqCst) }
            }
        };
        let options = LogOptions { follow: true, tail: Some(1), ..Default::default() };
        let reading = tokio::spawn({
            let path = path.clone();
            async move { read_logs(&path, &options, tx, running).await }
        });
        let mut seen = String::new();
        let mut until = async |wanted: &str| {
            while !seen.contains(wanted) {
                let chunk = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
                seen.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        };
        until("line 1\n").await;
        // A line written in two writes, then rotation: rename, and a new file.
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(format!("{T} stdout F line").as_bytes()).unwrap();
        file.flush().unwrap();
        tokio::time::sleep(FOLLOW_POLL * 2).await;
        file.write_all(b" 2\n").unwrap();
        until("line 2\n").await;
        std::fs::rename(&path, dir.path().join("0.log.20261203-161500")).unwrap();
        file.write_all(lines(3, 4).as_bytes()).unwrap();
        std::fs::write(&path, lines(4, 5)).unwrap();
        until("line 4\n").await;
        assert_eq!(seen, "line 1\nline 2\nline 3\nline 4\n");
        stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(10), reading).await.unwrap().unwrap().unwrap();
    }

    #[tokio::test]
    async fn follow_ends_when_the_reader_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, lines(0, 1)).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let options = LogOptions { follow: true, ..Default::default() };
        let reading = tokio::spawn(async move { read_logs(&path, &options, tx, || async { true }).await });
        assert_eq!(&rx.recv().await.unwrap()[..], b"line 0\n");
        drop(rx);
        tokio::time::timeout(Duration::from_secs(10), reading).await.unwrap().unwrap().unwrap();
    }
}
