//! Markdown tables, the form every section reports in.

/// One table: a header and rows of cells; the first column holds labels (left-aligned) unless
/// told otherwise, the others numbers (right-aligned).
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    label_first: bool,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: AsRef<str>>(header: &[S]) -> Table {
        Table {
            header: header.iter().map(|h| h.as_ref().to_owned()).collect(),
            rows: Vec::new(),
            label_first: true,
        }
    }

    /// Every column right-aligned (a table of numbers only).
    pub fn numbers_only(mut self) -> Table {
        self.label_first = false;
        self
    }

    /// Adds a row; missing cells are empty, extra cells are an error in the caller's code
    /// and are dropped.
    pub fn row<S: AsRef<str>>(&mut self, cells: &[S]) {
        let mut row: Vec<String> = cells.iter().map(|c| escape(c.as_ref())).collect();
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    /// The table as markdown, ending with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&line(&self.header));
        let rule: Vec<String> = (0..self.header.len())
            .map(|i| {
                if i == 0 && self.label_first {
                    "---".to_owned()
                } else {
                    "---:".to_owned()
                }
            })
            .collect();
        out.push('|');
        out.push_str(&rule.join("|"));
        out.push_str("|\n");
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

fn line(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

/// A cell may not contain a bare `|` or a line break.
fn escape(cell: &str) -> String {
    cell.replace('|', "\\|").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_has_a_rule_with_labels_left_and_numbers_right() {
        let mut t = Table::new(&["path", "requests/s"]);
        t.row(&["direct", "1 / 2 / 3"]);
        assert_eq!(
            t.render(),
            "| path | requests/s |\n|---|---:|\n| direct | 1 / 2 / 3 |\n"
        );
        let mut t = Table::new(&["a", "b"]).numbers_only();
        t.row(&["1"]);
        assert_eq!(t.render(), "| a | b |\n|---:|---:|\n| 1 |  |\n");
    }

    #[test]
    fn cells_cannot_break_the_table() {
        let mut t = Table::new(&["x"]);
        t.row(&["error: a | b\nnext"]);
        assert!(t.render().ends_with("| error: a \\| b next |\n"));
    }
}
