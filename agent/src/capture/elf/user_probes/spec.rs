//! The probe spec file (TOML): where to hook a native engine inferscope ships no profile for,
//! what each hook means, and how to read the request id from the hooked function's arguments.
//! Everything is checked here, before anything is attached, so a bad spec is a clear error at
//! start-up and never a surprise in the kernel.
use std::path::Path;

use inferscope_common::{
    MAX_DEREFS, MAX_ID_STRING, MAX_USER_PROBES, SchedKind, USER_SOURCE_ARG, USER_SOURCE_NONE,
    USER_SOURCE_RET, UserProbeConfig,
};
use serde::Deserialize;

/// Consecutive failed reads after which a probe is detached from a process, unless the spec
/// says otherwise.
pub(crate) const DEFAULT_MAX_FAILURES: u32 = 8;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read probe spec {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("probe spec {path} is not valid TOML for inferscope: {message}")]
    Syntax { path: String, message: String },
    #[error("probe spec: {0}")]
    Invalid(String),
}

/// What a probe's hit means for the request it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The engine took the request in (queued it).
    Arrival,
    /// The scheduler admitted it: prefill starts.
    Admit,
    /// The scheduler took it off the device (it will be admitted again).
    Preempt,
    /// An engine step (forward pass over the batch) starts; the value read is the batch's
    /// token count.
    StepBegin,
    /// The step ends (on the thread that began it).
    StepEnd,
    /// The engine produced the request's first token.
    FirstToken,
    /// The engine is done with the request.
    Finish,
}

impl Event {
    pub fn sched_kind(self) -> SchedKind {
        match self {
            Event::Arrival => SchedKind::TaskPosted,
            Event::Admit => SchedKind::TaskAdmitted,
            Event::Preempt => SchedKind::Preempt,
            Event::StepBegin => SchedKind::StepBegin,
            Event::StepEnd => SchedKind::StepEnd,
            Event::FirstToken => SchedKind::FirstToken,
            Event::Finish => SchedKind::Finish,
        }
    }

    fn is_step(self) -> bool {
        matches!(self, Event::StepBegin | Event::StepEnd)
    }
}

/// Where in the function the probe fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    #[default]
    Entry,
    Return,
}

/// How a probe's hit finds its HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Join {
    /// The hit happened on the thread that just read the HTTP request: that request is the
    /// one, and the id read (if any) is linked to it for later hits.
    Thread,
    /// The id read names a request an earlier `thread` hit linked.
    Id,
}

/// The integer or string the id is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum IdType {
    U8,
    U16,
    U32,
    U64,
    /// Bytes up to a NUL or `max_len`, hashed (FNV-1a) into a 64-bit id.
    String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdSpec {
    /// "arg0".."arg5" (the SysV integer argument registers rdi, rsi, rdx, rcx, r8, r9; register
    /// names are accepted too), or "ret" for a return probe's return value.
    pub from: String,
    /// Pointer loads applied in turn: each adds its offset to the value and loads the pointer
    /// stored there (at most 4).
    #[serde(default)]
    pub deref: Vec<i32>,
    /// Reads the id at value + offset (after the dereferences). Without it the value itself is
    /// the id (an integer argument, or what the last dereference loaded). Strings are always
    /// read from memory (offset 0 by default).
    pub offset: Option<i32>,
    #[serde(rename = "type", default = "default_type")]
    pub ty: IdType,
    /// For `type = "string"`: bytes read at most (1..=64).
    pub max_len: Option<u8>,
}

fn default_type() -> IdType {
    IdType::U64
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProbeDef {
    /// A name for messages; defaults to the symbol.
    pub name: Option<String>,
    /// The mapped executable or library that holds the function: a full path, or a substring of
    /// its file name (e.g. "libtensorrt_llm").
    pub object: String,
    /// The function: its demangled name (`ns::Class::method`), a signature to tell overloads
    /// apart, or its raw symbol name.
    pub symbol: String,
    pub event: Event,
    #[serde(default)]
    pub at: At,
    /// Defaults to `thread` for arrival, `id` for the others.
    #[serde(alias = "id_from")]
    pub join: Option<Join>,
    pub id: Option<IdSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    max_failures: Option<u32>,
    #[serde(default)]
    probe: Vec<ProbeDef>,
}

/// One checked probe, ready to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub name: String,
    pub object: String,
    pub symbol: String,
    pub event: Event,
    pub at: At,
    pub join: Join,
    /// What the kernel program reads (indexed by the probe's position in the spec).
    pub config: UserProbeConfig,
}

impl Probe {
    pub fn has_value(&self) -> bool {
        self.config.source != USER_SOURCE_NONE
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    pub probes: Vec<Probe>,
    /// Consecutive failed reads after which a probe is detached from a process.
    pub max_failures: u32,
}

impl ProbeSpec {
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            SpecError::Syntax { message, .. } => SpecError::Syntax {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Self, SpecError> {
        let file: FileSpec = toml::from_str(text).map_err(|e| SpecError::Syntax {
            path: "(inline)".into(),
            message: e.to_string(),
        })?;
        if file.probe.is_empty() {
            return Err(SpecError::Invalid(
                "no [[probe]] entries: add at least one".into(),
            ));
        }
        if file.probe.len() > MAX_USER_PROBES as usize {
            return Err(SpecError::Invalid(format!(
                "{} probes; at most {MAX_USER_PROBES} are supported",
                file.probe.len()
            )));
        }
        let max_failures = file.max_failures.unwrap_or(DEFAULT_MAX_FAILURES);
        if max_failures == 0 {
            return Err(SpecError::Invalid("max_failures must be at least 1".into()));
        }
        let probes = file
            .probe
            .into_iter()
            .enumerate()
            .map(|(i, def)| {
                check(def).map_err(|e| SpecError::Invalid(format!("probe #{}: {e}", i + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            probes,
            max_failures,
        })
    }
}

fn check(def: ProbeDef) -> Result<Probe, String> {
    if def.object.trim().is_empty() {
        return Err("`object` is empty: name the executable or library (path or file name)".into());
    }
    if def.symbol.trim().is_empty() {
        return Err("`symbol` is empty: name the function to hook".into());
    }
    let name = def.name.clone().unwrap_or_else(|| def.symbol.clone());
    let join = def.join.unwrap_or(if def.event == Event::Arrival {
        Join::Thread
    } else {
        Join::Id
    });
    if join == Join::Id && def.id.is_none() && !def.event.is_step() {
        return Err(format!(
            "{name}: event {:?} joins by id but has no [probe.id]: say how to read the id, or set join = \"thread\"",
            def.event
        ));
    }
    let mut config = UserProbeConfig {
        kind: def.event.sched_kind() as u8,
        ..UserProbeConfig::default()
    };
    if let Some(id) = &def.id {
        let (source, reg) = register(&id.from)
            .ok_or_else(|| format!("{name}: id.from {:?} is not arg0..arg5 or ret", id.from))?;
        match (source, def.at) {
            (USER_SOURCE_RET, At::Entry) => {
                return Err(format!("{name}: id.from = \"ret\" needs at = \"return\""));
            }
            (USER_SOURCE_ARG, At::Return) => {
                return Err(format!(
                    "{name}: argument registers are clobbered at return; read the id at entry"
                ));
            }
            _ => {}
        }
        if id.deref.len() > MAX_DEREFS {
            return Err(format!(
                "{name}: {} dereferences; at most {MAX_DEREFS}",
                id.deref.len()
            ));
        }
        config.source = source;
        config.reg = reg;
        config.n_derefs = id.deref.len() as u8;
        for (slot, off) in config.derefs.iter_mut().zip(&id.deref) {
            *slot = *off;
        }
        config.final_read = u8::from(id.offset.is_some() || id.ty == IdType::String);
        config.offset = id.offset.unwrap_or(0);
        (config.width, config.string_len) = match (id.ty, id.max_len) {
            (IdType::String, Some(n)) if n >= 1 && n as usize <= MAX_ID_STRING => (0, n),
            (IdType::String, Some(n)) => {
                return Err(format!("{name}: max_len {n} must be 1..={MAX_ID_STRING}"));
            }
            (IdType::String, None) => (0, MAX_ID_STRING as u8),
            (_, Some(_)) => {
                return Err(format!("{name}: max_len applies to type = \"string\" only"));
            }
            (IdType::U8, None) => (1, 0),
            (IdType::U16, None) => (2, 0),
            (IdType::U32, None) => (4, 0),
            (IdType::U64, None) => (8, 0),
        };
    }
    Ok(Probe {
        name,
        object: def.object,
        symbol: def.symbol,
        event: def.event,
        at: def.at,
        join,
        config,
    })
}

fn register(from: &str) -> Option<(u8, u8)> {
    let reg = match from {
        "ret" | "rax" => return Some((USER_SOURCE_RET, 0)),
        "arg0" | "rdi" => 0,
        "arg1" | "rsi" => 1,
        "arg2" | "rdx" => 2,
        "arg3" | "rcx" => 3,
        "arg4" | "r8" => 4,
        "arg5" | "r9" => 5,
        _ => return None,
    };
    Some((USER_SOURCE_ARG, reg))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
max_failures = 3

[[probe]]
object = "engine"
symbol = "engine_enqueue"
event = "arrival"
id = { from = "arg0" }

[[probe]]
name = "admit"
object = "/opt/engine/bin/engine"
symbol = "engine_admit(task*)"
event = "admit"
id = { from = "arg0", deref = [8, 0], offset = 16, type = "u32" }

[[probe]]
object = "engine"
symbol = "engine_step"
event = "step_begin"
id = { from = "rdi", type = "u32" }

[[probe]]
object = "engine"
symbol = "engine_step"
event = "step_end"
at = "return"

[[probe]]
object = "engine"
symbol = "engine_finish"
event = "finish"
id_from = "id"
id = { from = "arg1", type = "string", max_len = 32 }
"#;

    #[test]
    fn parses_every_field() {
        let spec = ProbeSpec::parse(GOOD).unwrap();
        assert_eq!(spec.max_failures, 3);
        assert_eq!(spec.probes.len(), 5);
        let arrival = &spec.probes[0];
        assert_eq!(arrival.join, Join::Thread);
        assert_eq!(arrival.name, "engine_enqueue");
        assert_eq!(arrival.config.kind, SchedKind::TaskPosted as u8);
        assert_eq!(
            (arrival.config.source, arrival.config.reg),
            (USER_SOURCE_ARG, 0)
        );
        assert_eq!(arrival.config.width, 8);
        let admit = &spec.probes[1];
        assert_eq!(admit.join, Join::Id);
        assert_eq!(admit.config.n_derefs, 2);
        assert_eq!(admit.config.derefs, [8, 0, 0, 0]);
        assert_eq!(admit.config.offset, 16);
        assert_eq!(admit.config.final_read, 1);
        assert_eq!(arrival.config.final_read, 0);
        assert_eq!(admit.config.width, 4);
        let step_end = &spec.probes[3];
        assert_eq!(step_end.at, At::Return);
        assert!(!step_end.has_value());
        let finish = &spec.probes[4];
        assert_eq!((finish.config.width, finish.config.string_len), (0, 32));
        assert_eq!(finish.config.final_read, 1);
        assert_eq!(finish.config.reg, 1);
    }

    #[test]
    fn defaults() {
        let spec = ProbeSpec::parse(
            "[[probe]]\nobject = \"x\"\nsymbol = \"f\"\nevent = \"admit\"\njoin = \"thread\"\n",
        )
        .unwrap();
        assert_eq!(spec.max_failures, DEFAULT_MAX_FAILURES);
        assert_eq!(spec.probes[0].at, At::Entry);
        assert!(!spec.probes[0].has_value());
    }

    fn err(text: &str) -> String {
        ProbeSpec::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn rejects_bad_specs_with_the_reason() {
        let probe = |extra: &str| format!("[[probe]]\nobject = \"x\"\nsymbol = \"f\"\n{extra}\n");
        assert!(err("").contains("no [[probe]]"));
        assert!(err(&probe("event = \"admit\"")).contains("no [probe.id]"));
        assert!(err(&probe("event = \"boot\"")).contains("unknown variant"));
        assert!(err(&probe("event = \"admit\"\ncolour = 1")).contains("unknown field"));
        assert!(err(&probe("event = \"admit\"\nid = { from = \"arg6\" }")).contains("arg0..arg5"));
        assert!(err(&probe("event = \"admit\"\nid = { from = \"ret\" }")).contains("needs at"));
        assert!(
            err(&probe(
                "event = \"admit\"\nat = \"return\"\nid = { from = \"arg0\" }"
            ))
            .contains("clobbered")
        );
        assert!(
            err(&probe(
                "event = \"admit\"\nid = { from = \"arg0\", deref = [0,0,0,0,0] }"
            ))
            .contains("at most 4")
        );
        assert!(
            err(&probe(
                "event = \"admit\"\nid = { from = \"arg0\", type = \"string\", max_len = 65 }"
            ))
            .contains("1..=64")
        );
        assert!(
            err(&probe(
                "event = \"admit\"\nid = { from = \"arg0\", max_len = 8 }"
            ))
            .contains("applies to type")
        );
        assert!(
            err(
                "max_failures = 0\n[[probe]]\nobject = \"x\"\nsymbol = \"f\"\nevent = \"step_end\""
            )
            .contains("at least 1")
        );
        assert!(
            err("[[probe]]\nobject = \"\"\nsymbol = \"f\"\nevent = \"step_end\"")
                .contains("object")
        );
        let many: String = (0..65).map(|_| probe("event = \"step_end\"")).collect();
        assert!(err(&many).contains("at most 64"));
        // Messages name the probe's position.
        assert!(
            err(&format!(
                "{}{}",
                probe("event = \"step_end\""),
                probe("event = \"admit\"")
            ))
            .contains("probe #2")
        );
    }

    #[test]
    fn shipped_examples_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/probes");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                ProbeSpec::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen >= 1);
    }
}
