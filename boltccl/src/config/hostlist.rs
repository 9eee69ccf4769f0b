//! Slurm's compressed host lists (`node[01-04,07],login1`), expanded in Slurm's order.

/// Expand a Slurm host list such as `node[01-04,07],gpu[1-2]-ib` into host names, in order.
/// Numbers keep the width of the range's lower bound (`[08-10]` gives `08`, `09`, `10`);
/// several bracket groups in one name expand as their product, the last varying fastest.
pub fn expand_hostlist(text: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for expr in split_top_level(text)? {
        if expr.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = expr;
        while let Some(open) = rest.find('[') {
            let close = rest[open..].find(']').map(|c| open + c).ok_or_else(|| format!("unclosed '[' in {expr:?}"))?;
            let prefix = &rest[..open];
            let numbers = expand_ranges(&rest[open + 1..close]).map_err(|e| format!("{e} in {expr:?}"))?;
            names = names.iter().flat_map(|n| numbers.iter().map(move |num| format!("{n}{prefix}{num}"))).collect();
            rest = &rest[close + 1..];
        }
        if rest.contains(']') {
            return Err(format!("unmatched ']' in {expr:?}"));
        }
        hosts.extend(names.into_iter().map(|n| n + rest));
    }
    if hosts.is_empty() {
        return Err("the host list is empty".into());
    }
    Ok(hosts)
}

/// Split at the commas that are not inside brackets.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced or nested brackets in host list {text:?}"));
        }
    }
    parts.push(text[start..].trim());
    Ok(parts)
}

/// `01-04,07` into `["01", "02", "03", "04", "07"]`.
fn expand_ranges(spec: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let width = lo.len();
        let parse = |s: &str| s.parse::<u64>().map_err(|_| format!("bad number {s:?}"));
        let (a, b) = (parse(lo)?, parse(hi)?);
        if b < a || b - a > 100_000 {
            return Err(format!("bad range {part:?}"));
        }
        out.extend((a..=b).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Expand Slurm's tasks-per-node list (`2(x3),1`: three nodes with 2 tasks, then one with 1).
pub fn expand_tasks_per_node(text: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("bad tasks-per-node entry {part:?} in {text:?}");
        let (count, times) = match part.split_once("(x") {
            Some((c, t)) => (c, t.strip_suffix(')').ok_or_else(bad)?),
            None => (part, "1"),
        };
        let count: usize = count.parse().map_err(|_| bad())?;
        let times: usize = times.parse().map_err(|_| bad())?;
        if times > 100_000 {
            return Err(bad());
        }
        out.extend(std::iter::repeat_n(count, times));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_ranges_lists_and_padding() {
        assert_eq!(expand_hostlist("node[01-04,07]").unwrap(), ["node01", "node02", "node03", "node04", "node07"]);
        assert_eq!(expand_hostlist("a[8-10],login").unwrap(), ["a8", "a9", "a10", "login"]);
        assert_eq!(expand_hostlist("n[098-100]").unwrap(), ["n098", "n099", "n100"]);
        assert_eq!(expand_hostlist("r[1-2]-n[1-2].ib").unwrap(), ["r1-n1.ib", "r1-n2.ib", "r2-n1.ib", "r2-n2.ib"]);
        assert_eq!(expand_hostlist("mac-studio").unwrap(), ["mac-studio"]);
    }

    #[test]
    fn rejects_malformed_lists() {
        for bad in ["node[01-04", "node]", "n[4-1]", "n[a-b]", "", "n[[1]]"] {
            assert!(expand_hostlist(bad).is_err(), "{bad:?} should fail");
        }
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_tasks_per_node("4").unwrap(), [4]);
        assert!(expand_tasks_per_node("2(x").is_err());
    }
}
