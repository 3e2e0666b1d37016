//! Which container a traced process runs in, from its /proc/PID/cgroup: the container id (the
//! 64-hex id containerd, CRI-O, Docker and podman give it) and, under Kubernetes, the pod's uid
//! that the kubelet writes into the pod's cgroup name. cgroup v1, v2 and hybrid layouts; the
//! cgroupfs and systemd drivers; paths relative to a cgroup namespace (`/../..`) alike.
//! An unknown layout yields no id (the process is then named by pid alone), never an error.

/// What the cgroup path says about a process's container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerId {
    /// 64 lowercase hex digits.
    pub id: String,
    /// "containerd", "cri-o", "docker", "podman", or "unknown" where only the id was seen.
    pub runtime: &'static str,
    /// The Kubernetes pod's uid (with dashes), where the path has a `pod<uid>` level.
    pub pod_uid: Option<String>,
}

/// Reads /proc/PID/cgroup; `None` for a process on the host or a layout not recognised.
pub(crate) fn of_process(pid: u32) -> Option<ContainerId> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse(&text)
}

/// Parses the contents of /proc/PID/cgroup. The unified (`0::`) line is looked at first; on
/// hybrid and v1 hosts the controllers' lines carry the same path.
pub fn parse(text: &str) -> Option<ContainerId> {
    // hierarchy-id:controllers:path; the path may itself contain ':'.
    let lines = || {
        text.lines().filter_map(|l| {
            let mut fields = l.splitn(3, ':');
            let hierarchy = fields.next()?;
            fields.next()?;
            Some((hierarchy, fields.next()?))
        })
    };
    lines()
        .filter(|(h, _)| *h == "0")
        .chain(lines().filter(|(h, _)| *h != "0"))
        .find_map(|(_, path)| parse_path(path))
}

/// One cgroup path, e.g.
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`.
pub(crate) fn parse_path(path: &str) -> Option<ContainerId> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // The innermost container level wins (a container may create sub-cgroups of its own).
    let (index, id, runtime) = segments.iter().enumerate().rev().find_map(|(i, s)| {
        container_level(s, segments[..i].last().copied()).map(|(id, rt)| (i, id, rt))
    })?;
    let pod_uid = segments[..index].iter().rev().find_map(|s| pod_level(s));
    let runtime = match runtime {
        "unknown" if pod_uid.is_some() => "kubernetes",
        rt => rt,
    };
    Some(ContainerId {
        id: id.to_string(),
        runtime,
        pod_uid,
    })
}

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`, `libpod-<id>.scope`
/// (systemd driver) or a bare `<id>` under a runtime's parent (cgroupfs driver).
fn container_level<'a>(segment: &'a str, parent: Option<&str>) -> Option<(&'a str, &'static str)> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    const PREFIXES: &[(&str, &str)] = &[
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
        ("libpod-", "podman"),
    ];
    for (prefix, runtime) in PREFIXES {
        if let Some(rest) = name.strip_prefix(prefix) {
            // crio-conmon-<id>, libpod-conmon-<id>: the runtime's monitor, not the container.
            return is_container_id(rest).then_some((rest, *runtime));
        }
    }
    if !is_container_id(name) {
        return None;
    }
    let runtime = match parent {
        Some("docker") => "docker",
        Some("libpod_parent") => "podman",
        Some(p) if p.starts_with("crio") => "cri-o",
        _ => "unknown",
    };
    Some((name, runtime))
}

/// `pod<uid>` (cgroupfs driver) or `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_level(segment: &str) -> Option<String> {
    let name = segment.strip_suffix(".slice").unwrap_or(segment);
    let at = name.rfind("pod")?;
    let uid = name[at + 3..].replace('_', "-");
    let is_uid = uid.len() == 36
        && uid.char_indices().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        });
    is_uid.then_some(uid)
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3e8b0d1c2a4f5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbba";
    const UID: &str = "8c1f0a4e-6b2d-4f3a-9e7c-1d2b3c4d5e6f";

    fn expect(text: &str, runtime: &str, pod: bool) {
        let got = parse(text).unwrap_or_else(|| panic!("no id in {text}"));
        assert_eq!(got.id, ID, "{text}");
        assert_eq!(got.runtime, runtime, "{text}");
        assert_eq!(got.pod_uid.as_deref(), pod.then_some(UID), "{text}");
    }

    #[test]
    fn containerd_under_kubernetes_v2_systemd_driver() {
        expect(
            &format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope\n",
                UID.replace('-', "_")
            ),
            "containerd",
            true,
        );
    }

    #[test]
    fn containerd_under_kubernetes_v2_cgroupfs_driver_and_guaranteed_qos() {
        expect(&format!("0::/kubepods/pod{UID}/{ID}\n"), "kubernetes", true);
        expect(
            &format!("0::/kubepods/besteffort/pod{UID}/{ID}\n"),
            "kubernetes",
            true,
        );
    }

    #[test]
    fn cri_o_v2_systemd_and_its_conmon_is_not_the_container() {
        let uid = UID.replace('-', "_");
        expect(
            &format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/crio-{ID}.scope\n"
            ),
            "cri-o",
            true,
        );
        let conmon = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/crio-conmon-{ID}.scope\n"
        );
        assert_eq!(parse(&conmon), None);
    }

    #[test]
    fn kubernetes_cgroup_v1_every_controller_line() {
        let text = format!(
            "12:pids:/kubepods/burstable/pod{UID}/{ID}\n\
             11:memory:/kubepods/burstable/pod{UID}/{ID}\n\
             5:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n\
             1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        expect(&text, "kubernetes", true);
    }

    #[test]
    fn hybrid_host_with_an_empty_unified_line() {
        // Hybrid: v1 controllers carry the path; the unified hierarchy is mounted but unused.
        let text =
            format!("13:misc:/\n12:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n");
        expect(&text, "docker", false);
    }

    #[test]
    fn podman_with_runc_and_cgroupfs_on_a_hybrid_host_as_captured() {
        // /proc/self/cgroup inside `podman --runtime runc --cgroup-manager cgroupfs run` on the
        // CI machine (Debian 12, hybrid cgroups), as printed.
        let id = "0f4337bf4f7defbae24b920de3376723c4c4680fa1943f352c9299dd9b087d35";
        let text = [
            "9:name=systemd",
            "8:pids",
            "7:blkio",
            "6:freezer",
            "5:devices",
            "4:memory",
            "3:cpuset",
            "2:cpuacct",
            "1:cpu",
            "0:",
        ]
        .iter()
        .map(|h| format!("{h}:/libpod_parent/libpod-{id}\n"))
        .collect::<String>();
        let got = parse(&text).unwrap();
        assert_eq!(got.id, id);
        assert_eq!(got.runtime, "podman");
        assert_eq!(got.pod_uid, None);
    }

    #[test]
    fn docker_and_podman_systemd_and_cgroupfs() {
        expect(
            &format!("0::/system.slice/docker-{ID}.scope\n"),
            "docker",
            false,
        );
        expect(
            &format!("0::/machine.slice/libpod-{ID}.scope\n"),
            "podman",
            false,
        );
        // A container that made sub-cgroups of its own (systemd inside, --cgroupns=private).
        expect(
            &format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            "podman",
            false,
        );
        expect(
            &format!("7:memory:/libpod_parent/libpod-{ID}\n0::/libpod_parent/libpod-{ID}\n"),
            "podman",
            false,
        );
        expect(&format!("4:devices:/libpod_parent/{ID}\n"), "podman", false);
    }

    #[test]
    fn paths_seen_from_inside_a_cgroup_namespace() {
        expect(
            &format!(
                "0::/../../kubepods-besteffort-pod{}.slice/cri-containerd-{ID}.scope\n",
                UID.replace('-', "_")
            ),
            "containerd",
            true,
        );
    }

    #[test]
    fn host_processes_and_unknown_layouts_have_no_id() {
        for text in [
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/system.slice/ssh.service\n",
            "0::/\n",
            "12:memory:/\n0::/init.scope\n",
            "",
            "garbage without colons",
            "0::/mystery/ABCDEF\n",
            // 63 hex digits, uppercase: not an id.
            &format!("0::/docker/{}\n", &ID[1..]),
            &format!("0::/docker/{}\n", ID.to_uppercase()),
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }

    #[test]
    fn a_process_is_read_from_its_own_cgroup_file_and_a_missing_one_has_no_id() {
        let own = std::fs::read_to_string("/proc/self/cgroup").expect("reading /proc/self/cgroup");
        assert_eq!(of_process(std::process::id()), parse(&own));
        // pid_max is at most 2^22: this pid cannot exist.
        assert_eq!(of_process(u32::MAX), None);
    }
}
