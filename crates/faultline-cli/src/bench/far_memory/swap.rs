//! Swap for the kernel rows of `bench far-memory`, set up as a user who
//! wants to exceed RAM on one machine would: swap on the zram device (sized
//! to hold twice the set, priority 100) or a swap file on disk (twice the
//! set, under `$FAULTLINE_BENCH_DIR` or /var/tmp), the machine's default
//! swappiness. [`Swap`] turns it off and undoes the setup on drop, so the
//! machine is left as it was (swap off). Where swap cannot be turned on
//! (no zram device, a filesystem that refuses swap files, swap already in
//! use), [`Swap::on`] says why and the row is skipped with that note.

use std::path::PathBuf;
use std::process::Command;

/// Swap that is on for the life of the value.
pub struct Swap {
    device: PathBuf,
    zram: bool,
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// Whether some swap is already on (then the rows would share it).
fn swap_in_use() -> bool {
    std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1)
}

impl Swap {
    /// Swap on `/dev/zram0` (`zram`) or a swap file, `bytes` large.
    ///
    /// # Errors
    /// Why swap could not be turned on (the row's note).
    pub fn on(zram: bool, bytes: usize) -> Result<Swap, String> {
        if swap_in_use() {
            return Err(
                "swap is already on (see /proc/swaps): turn it off to measure this row".into(),
            );
        }
        let device = if zram {
            PathBuf::from("/dev/zram0")
        } else {
            let dir = std::env::var_os("FAULTLINE_BENCH_DIR")
                .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
            dir.join(format!("faultline-swap-{}", std::process::id()))
        };
        let s = Swap { device, zram };
        s.make(bytes)?;
        let dev = s.device.display().to_string();
        run("mkswap", &[&dev])?;
        run("swapon", &["-p", "100", &dev])?;
        Ok(s)
    }

    fn make(&self, bytes: usize) -> Result<(), String> {
        if self.zram {
            let _ = std::fs::write("/sys/block/zram0/reset", "1");
            return std::fs::write("/sys/block/zram0/disksize", bytes.to_string())
                .map_err(|e| format!("no usable zram device /dev/zram0: {e}"));
        }
        let f = std::fs::File::create(&self.device)
            .map_err(|e| format!("creating {}: {e}", self.device.display()))?;
        // A swap file must have no holes: write it (fallocate is refused
        // as swap by some filesystems).
        let zeros = vec![0u8; 1 << 20];
        let mut w = std::io::BufWriter::new(f);
        for _ in 0..bytes.div_ceil(1 << 20) {
            std::io::Write::write_all(&mut w, &zeros)
                .map_err(|e| format!("writing the swap file: {e}"))?;
        }
        let f = w
            .into_inner()
            .map_err(|e| format!("writing the swap file: {e}"))?;
        f.sync_all()
            .map_err(|e| format!("syncing the swap file: {e}"))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.device, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("chmod the swap file: {e}"))
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        let dev = self.device.display().to_string();
        let _ = run("swapoff", &[&dev]);
        if self.zram {
            let _ = std::fs::write("/sys/block/zram0/reset", "1");
        } else {
            let _ = std::fs::remove_file(&self.device);
        }
    }
}
