//! Draws a [`Report`] with ratatui: a header with the cluster's figures, then the nodes or
//! the pools page. Only layout and formatting; every figure comes computed.

use super::model::{NodeRow, PoolRow, Rates, Report, DIRECTIONS};
use super::view::{Page, ViewState};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use ratatui::Frame;

/// Characters of a pool's usage bar on the pools page.
const BAR_WIDTH: usize = 30;
/// Widest name column: longer node and pool names are cut, the figures stay on screen.
const NAME_WIDTH_MAX: usize = 32;

/// What one frame shows.
pub struct Screen<'a> {
    /// The latest report, if any refresh succeeded yet.
    pub report: Option<&'a Report>,
    /// Why the latest refresh failed (the cluster could not be reached), if it did.
    pub error: Option<&'a str>,
    pub state: &'a ViewState,
    pub refresh_seconds: f64,
}

/// Draws `screen` over the whole frame.
pub fn draw(frame: &mut Frame, screen: &Screen) {
    let [header, banner, body] = Layout::vertical([
        Constraint::Length(5),
        Constraint::Length(u16::from(screen.error.is_some())),
        Constraint::Min(0),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header_lines(screen)), header);
    if let Some(error) = screen.error {
        let text = format!("cannot reach the cluster: {error} (retrying; q quits)");
        let style = Style::new().fg(Color::White).bg(Color::Red);
        frame.render_widget(Paragraph::new(text).style(style), banner);
    }
    let Some(report) = screen.report else {
        let waiting = Paragraph::new("no snapshot of the cluster yet")
            .block(Block::bordered().title(" kvtier "));
        frame.render_widget(waiting, body);
        return;
    };
    match screen.state.page {
        Page::Nodes => {
            let mut rows = report.nodes.clone();
            screen.state.sort_nodes(&mut rows);
            frame.render_widget(nodes_table(&rows), body);
        }
        Page::Pools => {
            let mut rows = report.pools.clone();
            screen.state.sort_pools(&mut rows);
            frame.render_widget(pools_table(&rows), body);
        }
    }
}

fn header_lines(screen: &Screen) -> Vec<Line<'static>> {
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let page = match screen.state.page {
        Page::Nodes => "nodes",
        Page::Pools => "pools",
    };
    let mut lines = vec![Line::from(vec![
        Span::styled("kvtier top", bold),
        Span::raw(format!(
            "  page: {page} [Tab/n/p]  sort: {} [s]  quit [q]  every {:.0} s",
            screen.state.sort_name(),
            screen.refresh_seconds
        )),
    ])];
    let Some(report) = screen.report else {
        return lines;
    };
    let cluster = &report.cluster;
    let rates = &cluster.rates;
    lines.push(Line::from(vec![
        Span::styled("cluster ", bold),
        Span::raw(format!(
            "nodes {}/{} live  pools {}  hit {} (all {})  loads {}/s  stores {}/s  p50 {}  p99 {}  directory p99 {}",
            cluster.nodes_live,
            cluster.nodes,
            cluster.pools,
            percent(rates.hit_ratio),
            percent(rates.hit_ratio_total),
            count(rates.loads_per_second),
            count(rates.stores_per_second),
            seconds(rates.latency_p50_seconds),
            seconds(rates.latency_p99_seconds),
            seconds(cluster.directory_latency_p99_seconds),
        )),
    ]));
    let moved: Vec<String> = DIRECTIONS
        .iter()
        .map(|direction| format!("{direction} {}/s", bytes(moved(rates, direction))))
        .collect();
    lines.push(Line::from(vec![
        Span::styled("moved   ", bold),
        Span::raw(format!(
            "{}  evictions {}/s  expirations {}/s",
            moved.join("  "),
            count(rates.evictions_per_second),
            count(rates.expirations_per_second)
        )),
    ]));
    lines.push(Line::from(vec![
        Span::styled("bytes   ", bold),
        Span::raw(format!(
            "capacity {}  allocated {}  ready {}  pinned {}  reserved {}  retiring {}  quarantined {}",
            bytes(cluster.usage.capacity_bytes as f64),
            bytes(cluster.usage.allocated_bytes as f64),
            bytes(cluster.usage.ready_bytes as f64),
            bytes(cluster.usage.pinned_bytes as f64),
            bytes(cluster.usage.reserved_bytes as f64),
            bytes(cluster.usage.retiring_bytes as f64),
            bytes(cluster.usage.quarantined_bytes as f64),
        )),
    ]));
    if !report.unreachable.is_empty() {
        lines.push(Line::styled(
            format!("metrics not read: {}", report.unreachable.join("; ")),
            Style::new().fg(Color::Yellow),
        ));
    }
    lines
}

fn nodes_table(rows: &[NodeRow]) -> Table<'static> {
    let header = [
        "node",
        "id",
        "epoch",
        "state",
        "hit",
        "hit all",
        "loads/s",
        "stores/s",
        "load/s",
        "store/s",
        "demote/s",
        "repl/s",
        "restore/s",
        "p50",
        "p99",
    ];
    let body = rows.iter().map(|row| {
        let rates = &row.rates;
        let state_style = match row.state.as_str() {
            "live" => Style::new().fg(Color::Green),
            "suspect" | "draining" => Style::new().fg(Color::Yellow),
            _ => Style::new().fg(Color::Red),
        };
        let mut cells = vec![
            Cell::from(row.name.clone()),
            Cell::from(row.node.to_string()),
            Cell::from(row.epoch.to_string()),
            Cell::from(Span::styled(row.state.clone(), state_style)),
            Cell::from(percent(rates.hit_ratio)),
            Cell::from(percent(rates.hit_ratio_total)),
            Cell::from(count(rates.loads_per_second)),
            Cell::from(count(rates.stores_per_second)),
        ];
        cells.extend(
            DIRECTIONS
                .iter()
                .map(|direction| Cell::from(bytes(moved(rates, direction)))),
        );
        cells.push(Cell::from(seconds(rates.latency_p50_seconds)));
        cells.push(Cell::from(seconds(rates.latency_p99_seconds)));
        Row::new(cells)
    });
    let widths = [
        Constraint::Length(name_width(rows.iter().map(|row| row.name.as_str()))),
        Constraint::Length(4),
        Constraint::Length(6),
        Constraint::Length(9),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(8),
    ];
    Table::new(body, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(Block::bordered().title(" Nodes "))
}

fn pools_table(rows: &[PoolRow]) -> Table<'static> {
    let header = [
        "pool",
        "id",
        "medium",
        "scope",
        "capacity",
        "usage",
        "used",
        "ready",
        "pinned",
        "reserved",
        "retiring",
        "quarantined",
    ];
    let body = rows.iter().map(|row| {
        Row::new(vec![
            Cell::from(row.name.clone()),
            Cell::from(row.pool.to_string()),
            Cell::from(row.medium.clone()),
            Cell::from(row.scope.clone()),
            Cell::from(bytes(row.usage.capacity_bytes as f64)),
            Cell::from(usage_bar(row)),
            Cell::from(percent(Some(super::view::used_fraction(row)))),
            Cell::from(bytes(row.usage.ready_bytes as f64)),
            Cell::from(bytes(row.usage.pinned_bytes as f64)),
            Cell::from(bytes(row.usage.reserved_bytes as f64)),
            Cell::from(bytes(row.usage.retiring_bytes as f64)),
            Cell::from(bytes(row.usage.quarantined_bytes as f64)),
        ])
    });
    let widths = [
        Constraint::Length(name_width(rows.iter().map(|row| row.name.as_str()))),
        Constraint::Length(4),
        Constraint::Length(6),
        Constraint::Length(12),
        Constraint::Length(10),
        Constraint::Length(BAR_WIDTH as u16),
        Constraint::Length(7),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(11),
    ];
    Table::new(body, widths)
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::BOLD)))
        .block(
            Block::bordered().title(
                " Pools (usage: █ ready  ▓ retiring  ▒ other allocated  ░ reserved  · free) ",
            ),
        )
}

/// The width of a name column: the longest name (at least the heading's), at most
/// [`NAME_WIDTH_MAX`] characters.
fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> u16 {
    let longest = names.map(|name| name.chars().count()).max().unwrap_or(0);
    longest.clamp(4, NAME_WIDTH_MAX) as u16
}

/// A pool's bytes by state as a stacked bar of [`BAR_WIDTH`] characters.
fn usage_bar(row: &PoolRow) -> Line<'static> {
    let capacity = row.usage.capacity_bytes.max(1) as f64;
    let other_allocated = row
        .usage
        .allocated_bytes
        .saturating_sub(row.usage.ready_bytes)
        .saturating_sub(row.usage.retiring_bytes);
    let segments = [
        (row.usage.ready_bytes, '█', Color::Green),
        (row.usage.retiring_bytes, '▓', Color::Magenta),
        (other_allocated, '▒', Color::Blue),
        (row.usage.reserved_bytes, '░', Color::Yellow),
    ];
    let mut used = 0;
    let mut spans = Vec::with_capacity(segments.len() + 1);
    for (segment_bytes, symbol, color) in segments {
        let width = ((segment_bytes as f64 / capacity) * BAR_WIDTH as f64).round() as usize;
        let width = width.min(BAR_WIDTH - used);
        used += width;
        spans.push(Span::styled(
            symbol.to_string().repeat(width),
            Style::new().fg(color),
        ));
    }
    spans.push(Span::styled(
        "·".repeat(BAR_WIDTH - used),
        Style::new().fg(Color::DarkGray),
    ));
    Line::from(spans)
}

fn moved(rates: &Rates, direction: &str) -> f64 {
    rates
        .bytes_per_second
        .get(direction)
        .copied()
        .unwrap_or(0.0)
}

/// A ratio as a percentage, `-` when there is none.
fn percent(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".into(), |ratio| format!("{:.1}%", ratio * 100.0))
}

/// A count or rate with at most one decimal.
fn count(value: f64) -> String {
    if value >= 100.0 || value == value.trunc() {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// Bytes with a binary prefix.
pub(super) fn bytes(value: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = value;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A duration in seconds in µs, ms or s; `-` when there is none.
fn seconds(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(value) if value < 1e-3 => format!("{:.0}µs", value * 1e6),
        Some(value) if value < 1.0 => format!("{:.1}ms", value * 1e3),
        Some(value) => format!("{value:.2}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::model::PoolUsage;

    #[test]
    fn figures_format_with_units() {
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(seconds(Some(0.000_04)), "40µs");
        assert_eq!(seconds(Some(0.0021)), "2.1ms");
        assert_eq!(seconds(None), "-");
        assert_eq!(percent(Some(0.875)), "87.5%");
        assert_eq!(count(2.5), "2.5");
        assert_eq!(count(1234.4), "1234");
    }

    #[test]
    fn a_usage_bar_is_always_its_width() {
        let mut row = PoolRow {
            name: "p".into(),
            pool: 0,
            medium: "cpu".into(),
            scope: "node-a".into(),
            usage: PoolUsage {
                capacity_bytes: 100,
                reserved_bytes: 10,
                allocated_bytes: 60,
                ready_bytes: 50,
                retiring_bytes: 5,
                quarantined_bytes: 0,
                pinned_bytes: 0,
            },
            free_bytes: 30,
        };
        let width = |row: &PoolRow| {
            usage_bar(row)
                .spans
                .iter()
                .map(|span| span.content.chars().count())
                .sum::<usize>()
        };
        assert_eq!(width(&row), BAR_WIDTH);
        assert!(usage_bar(&row).spans[0]
            .content
            .starts_with("███████████████"));
        row.usage.reserved_bytes = 500;
        assert_eq!(width(&row), BAR_WIDTH);
        row.usage.capacity_bytes = 0;
        assert_eq!(width(&row), BAR_WIDTH);
    }
}
