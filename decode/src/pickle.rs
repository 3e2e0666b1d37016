//! A bounded, inert reader of Python pickles (protocols 2 to 5).
//!
//! Python engines (SGLang) send pickled objects over their IPC. Unpickling runs arbitrary code,
//! so this reader never resolves anything: it interprets the opcodes into a tree of values in
//! which `GLOBAL`/`STACK_GLOBAL` are just (module, name) pairs and `REDUCE`, `NEWOBJ` and `BUILD`
//! are nodes holding their callable and arguments. Callers pattern-match that tree.
//!
//! Bounds: input bytes are the caller's; nesting depth, stack and memo sizes, and the total
//! work (values built, copied or kept) are capped; strings longer than [`MAX_KEPT_STR`] keep
//! only their length, and bytes only ever their length. Protocol 0/1 text opcodes, persistent
//! ids, extension codes and out-of-band buffers are refused. Every refusal is an error the
//! caller counts.
//!
//! Known simplification: a memoized container is copied at `MEMOIZE` time, so a later `GET` of
//! it sees it as it was then (usually empty: pickle memoizes containers before filling them).
//! Shared or recursive containers therefore decode as empty, never as cycles.

/// Why a pickle was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    #[error("pickle cut off before STOP")]
    Truncated,
    #[error("unknown pickle opcode")]
    UnknownOpcode,
    #[error("pickle opcode not accepted (protocol 0/1 text, persistent id, extension, buffer)")]
    Unsupported,
    #[error("pickle nesting too deep")]
    TooDeep,
    #[error("pickle length field beyond the input or the bounds")]
    TooLong,
    #[error("pickle needs more work or memory than allowed")]
    OverBudget,
    #[error("pickle stack underflow or misplaced mark")]
    Stack,
    #[error("pickle memo index unknown or memo too large")]
    Memo,
    #[error("pickle opcode applied to a value of the wrong type")]
    Type,
}

impl PickleError {
    /// Counter name for the error.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Truncated => "pickle_truncated",
            Self::UnknownOpcode => "pickle_unknown_opcode",
            Self::Unsupported => "pickle_unsupported_opcode",
            Self::TooDeep => "pickle_too_deep",
            Self::TooLong => "pickle_too_long",
            Self::OverBudget => "pickle_over_budget",
            Self::Stack => "pickle_stack_error",
            Self::Memo => "pickle_memo_error",
            Self::Type => "pickle_type_error",
        }
    }

    /// The agent counter this failure is counted in.
    pub fn counter(self) -> inferscope_model::Counter {
        use inferscope_model::Counter;

        match self {
            Self::Truncated => Counter::PickleTruncated,
            Self::UnknownOpcode => Counter::PickleUnknownOpcode,
            Self::Unsupported => Counter::PickleUnsupportedOpcode,
            Self::TooDeep => Counter::PickleTooDeep,
            Self::TooLong => Counter::PickleTooLong,
            Self::OverBudget => Counter::PickleOverBudget,
            Self::Stack => Counter::PickleStackError,
            Self::Memo => Counter::PickleMemoError,
            Self::Type => Counter::PickleTypeError,
        }
    }
}

/// Strings longer than this keep only their length (prompt text is never kept).
pub const MAX_KEPT_STR: usize = 256;

#[derive(Debug, Clone, Copy)]
pub struct PickleLimits {
    pub max_depth: u16,
    /// Values built, copied (memo, GET, DUP) or kept, plus kept string bytes / 16.
    pub max_work: u64,
    pub max_stack: usize,
    pub max_memo: usize,
    /// Items in one container.
    pub max_items: usize,
}

impl Default for PickleLimits {
    fn default() -> Self {
        // SGLang's largest messages (a batched output for a few hundred requests) build some
        // tens of thousands of values; 300k work units bound one message's memory to ~20 MB.
        Self {
            max_depth: 48,
            max_work: 300_000,
            max_stack: 16_384,
            max_memo: 65_536,
            max_items: 65_536,
        }
    }
}

enum Slot {
    Mark,
    Value(Value),
}

struct Machine<'a> {
    buf: &'a [u8],
    pos: usize,
    stack: Vec<Slot>,
    memo: Vec<Option<Value>>,
    work: u64,
    limits: PickleLimits,
}

/// Reads one pickle from the start of `buf` (up to STOP) into an inert value.
pub fn read(buf: &[u8], limits: &PickleLimits) -> Result<Value, PickleError> {
    let mut m = Machine {
        buf,
        pos: 0,
        stack: Vec::new(),
        memo: Vec::new(),
        work: 0,
        limits: *limits,
    };
    m.run()
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self.pos.checked_add(n).ok_or(PickleError::TooLong)?;
        if end > self.buf.len() {
            // A length beyond anything the limits allow is corrupt, not merely cut off.
            return Err(if n as u64 > self.limits.max_work.saturating_mul(64) {
                PickleError::TooLong
            } else {
                PickleError::Truncated
            });
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, PickleError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn charge(&mut self, units: u64) -> Result<(), PickleError> {
        self.work = self.work.saturating_add(units);
        if self.work > self.limits.max_work {
            return Err(PickleError::OverBudget);
        }
        Ok(())
    }

    fn push(&mut self, v: Value) -> Result<(), PickleError> {
        if self.stack.len() >= self.limits.max_stack {
            return Err(PickleError::OverBudget);
        }
        if v.depth() > self.limits.max_depth {
            return Err(PickleError::TooDeep);
        }
        self.charge(1)?;
        self.stack.push(Slot::Value(v));
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        match self.stack.pop() {
            Some(Slot::Value(v)) => Ok(v),
            _ => Err(PickleError::Stack),
        }
    }

    fn top(&mut self) -> Result<&mut Value, PickleError> {
        match self.stack.last_mut() {
            Some(Slot::Value(v)) => Ok(v),
            _ => Err(PickleError::Stack),
        }
    }

    /// The values above the topmost mark, and the mark removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let at = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or(PickleError::Stack)?;
        let items: Vec<Value> = self
            .stack
            .drain(at + 1..)
            .filter_map(|s| match s {
                Slot::Value(v) => Some(v),
                Slot::Mark => None,
            })
            .collect();
        self.stack.pop();
        if items.len() > self.limits.max_items {
            return Err(PickleError::OverBudget);
        }
        Ok(items)
    }

    fn text(&mut self, n: usize) -> Result<Value, PickleError> {
        let raw = self.take(n)?;
        if n > MAX_KEPT_STR {
            return Ok(Value::LongStr(n));
        }
        let s = std::str::from_utf8(raw).map_err(|_| PickleError::Type)?;
        self.charge(n as u64 / 16)?;
        Ok(Value::Str(s.to_owned()))
    }

    fn len_u64(&mut self) -> Result<usize, PickleError> {
        let n = self.u64()?;
        usize::try_from(n).map_err(|_| PickleError::TooLong)
    }

    /// A memo opcode's index argument: one byte, or four (`wide`, the LONG_ forms).
    fn memo_index(&mut self, wide: bool) -> Result<usize, PickleError> {
        Ok(if wide {
            self.u32()? as usize
        } else {
            usize::from(self.u8()?)
        })
    }

    fn memo_put(&mut self, index: usize) -> Result<(), PickleError> {
        if index >= self.limits.max_memo {
            return Err(PickleError::Memo);
        }
        let v = match self.stack.last() {
            Some(Slot::Value(v)) => v,
            _ => return Err(PickleError::Stack),
        };
        let cost = v.cost();
        let copy = v.clone();
        self.charge(cost)?;
        if index >= self.memo.len() {
            self.memo.resize(index + 1, None);
        }
        self.memo[index] = Some(copy);
        Ok(())
    }

    fn memo_get(&mut self, index: usize) -> Result<(), PickleError> {
        let v = self
            .memo
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(PickleError::Memo)?;
        let cost = v.cost();
        let copy = v.clone();
        self.charge(cost)?;
        self.push(copy)
    }

    /// The depth of a container holding `items` (or gaining them): one more than its deepest
    /// item, refused past the limit.
    fn container_depth(&self, items: &[Value]) -> Result<u16, PickleError> {
        let d = items.iter().map(Value::depth).max().unwrap_or(0) + 1;
        if d > self.limits.max_depth {
            return Err(PickleError::TooDeep);
        }
        Ok(d)
    }

    fn pair(&self, a: Value, b: Value) -> Result<(Box<Value>, Box<Value>, u16), PickleError> {
        let d = a.depth().max(b.depth()) + 1;
        if d > self.limits.max_depth {
            return Err(PickleError::TooDeep);
        }
        Ok((Box::new(a), Box::new(b), d))
    }

    fn tuple(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let d = self.container_depth(&items)?;
        self.push(Value::Tuple(items, d))
    }

    /// Appends to the list or set on top of the stack (APPEND, APPENDS, ADDITEMS).
    fn extend_top(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        let max_items = self.limits.max_items;
        let add = self.container_depth(&items)?;
        match self.top()? {
            Value::List(v, d) | Value::Set(v, d) => {
                if v.len() + items.len() > max_items {
                    return Err(PickleError::OverBudget);
                }
                v.extend(items);
                *d = (*d).max(add);
                Ok(())
            }
            _ => Err(PickleError::Type),
        }
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(PickleError::Stack);
        }
        let max_items = self.limits.max_items;
        let add = self.container_depth(&items)?;
        match self.top()? {
            Value::Dict(entries, d) => {
                if entries.len() + items.len() / 2 > max_items {
                    return Err(PickleError::OverBudget);
                }
                // Repeated keys are kept in order; lookups take the last (Python's value) and
                // inserting stays O(1) whatever the input.
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    entries.push((k, v));
                }
                *d = (*d).max(add);
                Ok(())
            }
            _ => Err(PickleError::Type),
        }
    }

    fn int_le(raw: &[u8]) -> Value {
        if raw.is_empty() {
            return Value::Int(0);
        }
        if raw.len() > 8 {
            return Value::BigInt(raw.len());
        }
        let negative = raw[raw.len() - 1] & 0x80 != 0;
        let mut a = if negative { [0xffu8; 8] } else { [0u8; 8] };
        a[..raw.len()].copy_from_slice(raw);
        Value::Int(i64::from_le_bytes(a))
    }

    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    // PROTO
                    let p = self.u8()?;
                    if !(2..=5).contains(&p) {
                        return Err(PickleError::Unsupported);
                    }
                }
                0x95 => {
                    // FRAME: a length hint only.
                    self.u64()?;
                }
                b'.' => return self.pop(),
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'J' => {
                    let v = self.u32()? as i32;
                    self.push(Value::Int(i64::from(v)))?
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(i64::from(v)))?
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push(Value::Int(i64::from(v)))?
                }
                0x8a => {
                    let n = usize::from(self.u8()?);
                    let raw = self.take(n)?;
                    self.push(Self::int_le(raw))?
                }
                0x8b => {
                    let n = self.u32()? as usize;
                    let raw = self.take(n)?;
                    self.push(Self::int_le(raw))?
                }
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Value::Float(f64::from_be_bytes(a)))?
                }
                0x8c => {
                    let n = usize::from(self.u8()?);
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                0x8d => {
                    let n = self.len_u64()?;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'C' | b'U' => {
                    let n = usize::from(self.u8()?);
                    self.take(n)?;
                    self.push(Value::Bytes(n))?
                }
                b'B' | b'T' => {
                    let n = self.u32()? as usize;
                    self.take(n)?;
                    self.push(Value::Bytes(n))?
                }
                0x8e | 0x96 => {
                    let n = self.len_u64()?;
                    self.take(n)?;
                    self.push(Value::Bytes(n))?
                }
                b')' => self.push(Value::Tuple(Vec::new(), 1))?,
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.tuple(items)?
                }
                b'(' => {
                    if self.stack.len() >= self.limits.max_stack {
                        return Err(PickleError::OverBudget);
                    }
                    self.charge(1)?;
                    self.stack.push(Slot::Mark)
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.tuple(items)?
                }
                b']' => self.push(Value::List(Vec::new(), 1))?,
                b'l' => {
                    let items = self.pop_mark()?;
                    let d = self.container_depth(&items)?;
                    self.push(Value::List(items, d))?
                }
                b'a' => {
                    let v = self.pop()?;
                    self.extend_top(vec![v])?
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    self.extend_top(items)?
                }
                0x8f => self.push(Value::Set(Vec::new(), 1))?,
                0x91 => {
                    let items = self.pop_mark()?;
                    let d = self.container_depth(&items)?;
                    self.push(Value::Set(items, d))?
                }
                b'}' => self.push(Value::Dict(Vec::new(), 1))?,
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(Vec::new(), 1))?;
                    self.set_items(items)?
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?
                }
                0x94 => {
                    let index = self.memo.len();
                    self.memo_put(index)?
                }
                // BINPUT, LONG_BINPUT; BINGET, LONG_BINGET.
                b'q' | b'r' => {
                    let i = self.memo_index(op == b'r')?;
                    self.memo_put(i)?
                }
                b'h' | b'j' => {
                    let i = self.memo_index(op == b'j')?;
                    self.memo_get(i)?
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.push(Value::Global { module, name })?
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(module), Value::Str(name)) => {
                            self.push(Value::Global { module, name })?
                        }
                        _ => return Err(PickleError::Type),
                    }
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let (a, b, d) = self.pair(callable, args)?;
                    self.push(Value::Reduce(a, b, d))?
                }
                0x81 => {
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let (a, b, d) = self.pair(cls, args)?;
                    self.push(Value::NewObj(a, b, d))?
                }
                0x92 => {
                    // NEWOBJ_EX: cls, args, kwargs (kwargs dropped).
                    self.pop()?;
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    let (a, b, d) = self.pair(cls, args)?;
                    self.push(Value::NewObj(a, b, d))?
                }
                b'b' => {
                    let state = self.pop()?;
                    let object = self.pop()?;
                    let (a, b, d) = self.pair(object, state)?;
                    self.push(Value::Build(a, b, d))?
                }
                b'0' => {
                    self.stack.pop().ok_or(PickleError::Stack)?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let v = self.top()?;
                    let cost = v.cost();
                    let copy = v.clone();
                    self.charge(cost)?;
                    self.push(copy)?
                }
                // Protocol 0/1 text opcodes, persistent ids, extensions, out-of-band buffers,
                // INST/OBJ.
                b'I'
                | b'L'
                | b'F'
                | b'S'
                | b'V'
                | b'p'
                | b'g'
                | b'P'
                | b'Q'
                | b'i'
                | b'o'
                | 0x82..=0x84
                | 0x97
                | 0x98 => return Err(PickleError::Unsupported),
                _ => return Err(PickleError::UnknownOpcode),
            }
        }
    }

    /// A newline-terminated ASCII name (GLOBAL's module and name), at most 256 bytes.
    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.buf[self.pos..];
        let window = &rest[..rest.len().min(MAX_KEPT_STR + 1)];
        let Some(n) = window.iter().position(|&b| b == b'\n') else {
            return Err(if rest.len() > MAX_KEPT_STR {
                PickleError::TooLong
            } else {
                PickleError::Truncated
            });
        };
        let raw = self.take(n + 1)?;
        let s = std::str::from_utf8(&raw[..n]).map_err(|_| PickleError::Type)?;
        if !s.is_ascii() {
            return Err(PickleError::Type);
        }
        Ok(s.to_owned())
    }
}

mod value;

pub use value::Value;

#[cfg(test)]
mod tests;
