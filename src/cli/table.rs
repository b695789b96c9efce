//! Aligned text tables for the command line: each column as wide as its widest cell,
//! so a long id or URL moves the columns after it instead of pushing its row out of
//! line.

/// How a column's cells are aligned: text to the left, numbers to the right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table being filled row by row, then rendered at once (the widths need every row).
#[derive(Debug)]
pub struct Table {
    headers: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[(&'static str, Align)]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are blank, extra ones are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines, two spaces between columns, no trailing blanks.
    pub fn render(&self) -> String {
        let n = self.headers.len();
        let cell = |row: &[String], i: usize| row.get(i).map_or("", String::as_str).to_string();
        let widths: Vec<usize> = (0..n)
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| cell(r, i).chars().count())
                    .chain([self.headers[i].0.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let mut out = String::new();
            for (i, text) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(text.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                match self.headers[i].1 {
                    Align::Left => {
                        out.push_str(text);
                        out.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        out.extend(std::iter::repeat_n(' ', pad));
                        out.push_str(text);
                    }
                }
            }
            out.trim_end().to_string()
        };
        let mut lines = vec![line(self.headers.iter().map(|h| h.0.to_string()).collect())];
        for r in &self.rows {
            lines.push(line((0..n).map(|i| cell(r, i)).collect()));
        }
        lines.join("\n")
    }
}

/// `Some(x)` formatted with `digits` decimals, `-` for none.
pub fn opt_f64(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_take_the_width_of_their_widest_cell() {
        let mut t = Table::new(&[("ID", Align::Left), ("JOBS", Align::Right)]);
        t.row(vec!["a-rather-long-backend-name".into(), "3".into()]);
        t.row(vec!["b".into(), "12345".into()]);
        let text = t.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ID                           JOBS");
        assert_eq!(lines[1], "a-rather-long-backend-name      3");
        assert_eq!(lines[2], "b                           12345");
    }

    #[test]
    fn missing_cells_are_blank_and_numbers_show_a_dash_for_none() {
        let mut t = Table::new(&[("A", Align::Left), ("B", Align::Left)]);
        t.row(vec!["x".into()]);
        assert_eq!(t.render().lines().nth(1), Some("x"));
        assert_eq!(opt_f64(None, 3), "-");
        assert_eq!(opt_f64(Some(0.5), 3), "0.500");
    }
}
