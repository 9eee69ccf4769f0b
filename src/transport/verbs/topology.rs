//! The N×N device matrix (MLX's `MLX_IBV_DEVICES` format): row `i`, column `j` names the
//! device(s) rank `i` uses to reach rank `j` — `null` (no cable), a name, or a list of names
//! when several cables join the pair.

use crate::error::{Error, Result};
use serde_json::Value;

/// Parsed matrix: `cells[i][j]` is the list of devices rank `i` uses toward rank `j`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMatrix {
    /// Devices per (rank, peer); empty when there is no RDMA link.
    pub cells: Vec<Vec<Vec<String>>>,
}

impl DeviceMatrix {
    /// Parse the JSON text of a matrix for `world` ranks.
    pub fn parse(text: &str, world: usize) -> std::result::Result<DeviceMatrix, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
        let rows = v.as_array().ok_or("expected a JSON list of rows")?;
        if rows.len() != world {
            return Err(format!("{} rows for a world of {world} ranks", rows.len()));
        }
        let mut cells = Vec::with_capacity(world);
        for (i, row) in rows.iter().enumerate() {
            let row = row.as_array().ok_or_else(|| format!("row {i} is not a list"))?;
            if row.len() != world {
                return Err(format!("row {i} has {} cells for a world of {world} ranks", row.len()));
            }
            let mut out = Vec::with_capacity(world);
            for (j, c) in row.iter().enumerate() {
                let names: Vec<String> = match c {
                    Value::Null => vec![],
                    Value::String(s) if s.is_empty() => vec![],
                    Value::String(s) => vec![s.clone()],
                    Value::Array(a) => a
                        .iter()
                        .map(|x| {
                            x.as_str().map(str::to_string).ok_or_else(|| format!("cell [{i}][{j}] lists a non-string"))
                        })
                        .collect::<std::result::Result<_, _>>()?,
                    _ => return Err(format!("cell [{i}][{j}] must be null, a device name or a list of names")),
                };
                if i == j && !names.is_empty() {
                    return Err(format!("cell [{i}][{i}] (a rank to itself) must be null"));
                }
                out.push(names);
            }
            cells.push(out);
        }
        for (i, row) in cells.iter().enumerate() {
            for (j, cell) in row.iter().enumerate() {
                if cell.is_empty() != cells[j][i].is_empty() {
                    return Err(format!(
                        "cell [{i}][{j}] and cell [{j}][{i}] disagree on whether ranks {i} and {j} are cabled"
                    ));
                }
            }
        }
        Ok(DeviceMatrix { cells })
    }

    /// Read the matrix from `path`.
    pub fn load(path: &std::path::Path, world: usize) -> Result<DeviceMatrix> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("BOLTCCL_IBV_DEVICES={}: cannot read: {e}", path.display())))?;
        DeviceMatrix::parse(&text, world)
            .map_err(|e| Error::Config(format!("BOLTCCL_IBV_DEVICES={}: {e}", path.display())))
    }

    /// A full mesh using `device` everywhere (tests, single-device hosts).
    pub fn uniform(world: usize, device: &str) -> DeviceMatrix {
        let cells = (0..world)
            .map(|i| (0..world).map(|j| if i == j { vec![] } else { vec![device.to_string()] }).collect())
            .collect();
        DeviceMatrix { cells }
    }

    /// Peers of `rank` without an RDMA device.
    pub fn uncabled(&self, rank: usize) -> Vec<usize> {
        (0..self.cells.len()).filter(|&j| j != rank && self.cells[rank][j].is_empty()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx_format_with_nulls_names_and_lists() {
        let m = DeviceMatrix::parse(
            r#"[[null,"rdma_en3",["rdma_en4","rdma_en5"]],["rdma_en3",null,null],[["a","b"],null,null]]"#,
            3,
        )
        .unwrap();
        assert_eq!(m.cells[0][2], vec!["rdma_en4", "rdma_en5"]);
        assert_eq!(m.uncabled(1), vec![2]);
        assert!(DeviceMatrix::parse("[[null]]", 2).unwrap_err().contains("1 rows"));
        assert!(DeviceMatrix::parse(r#"[["x"]]"#, 1).unwrap_err().contains("must be null"));
        assert!(DeviceMatrix::parse(r#"[[null,"a"],[null,null]]"#, 2).unwrap_err().contains("disagree"));
        assert_eq!(DeviceMatrix::uniform(2, "rdma_lo").cells[1][0], vec!["rdma_lo"]);
    }
}
