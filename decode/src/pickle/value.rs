//! The inert tree a pickle decodes into.

/// An inert pickled value. Containers record their nesting depth.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits (its byte length).
    BigInt(usize),
    Float(f64),
    Str(String),
    /// A string longer than [`MAX_KEPT_STR`] bytes: only its length.
    LongStr(usize),
    /// Bytes or bytearray: only the length.
    Bytes(usize),
    Tuple(Vec<Value>, u16),
    List(Vec<Value>, u16),
    Set(Vec<Value>, u16),
    Dict(Vec<(Value, Value)>, u16),
    /// A class or function by name, never resolved.
    Global {
        module: String,
        name: String,
    },
    /// `callable(*args)`, never called.
    Reduce(Box<Value>, Box<Value>, u16),
    /// `cls.__new__(cls, *args)`.
    NewObj(Box<Value>, Box<Value>, u16),
    /// `object.__setstate__(state)`.
    Build(Box<Value>, Box<Value>, u16),
}

impl Value {
    pub fn depth(&self) -> u16 {
        match self {
            Value::Tuple(_, d)
            | Value::List(_, d)
            | Value::Set(_, d)
            | Value::Dict(_, d)
            | Value::Reduce(_, _, d)
            | Value::NewObj(_, _, d)
            | Value::Build(_, _, d) => *d,
            _ => 0,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_float(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// Items of a list or tuple.
    pub fn items(&self) -> Option<&[Value]> {
        match self {
            Value::List(v, _) | Value::Tuple(v, _) => Some(v),
            _ => None,
        }
    }

    /// The value under a string key of a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(entries, _) => entries
                .iter()
                .rfind(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn is_global(&self, module: &str, name: &str) -> bool {
        matches!(self, Value::Global { module: m, name: n } if m == module && n == name)
    }

    /// Work units to build or copy this value (nodes plus kept bytes / 16); iterative.
    pub(super) fn cost(&self) -> u64 {
        let mut total = 0u64;
        let mut todo: Vec<&Value> = vec![self];
        while let Some(v) = todo.pop() {
            total += 1;
            match v {
                Value::Str(s) => total += s.len() as u64 / 16,
                Value::Global { module, name } => total += (module.len() + name.len()) as u64 / 16,
                Value::Tuple(items, _) | Value::List(items, _) | Value::Set(items, _) => {
                    todo.extend(items.iter())
                }
                Value::Dict(entries, _) => {
                    for (k, v) in entries {
                        todo.push(k);
                        todo.push(v);
                    }
                }
                Value::Reduce(a, b, _) | Value::NewObj(a, b, _) | Value::Build(a, b, _) => {
                    todo.push(a);
                    todo.push(b);
                }
                _ => {}
            }
        }
        total
    }
}
