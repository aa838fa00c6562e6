//! What `kvtier top` is showing and how keys change it: the page (nodes or pools) and each
//! page's sort order. Pure, so keys are tested without a terminal.

use super::model::{NodeRow, PoolRow};

/// The page on screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    Nodes,
    Pools,
}

/// The order of the nodes page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSort {
    Name,
    /// Highest hit ratio first.
    HitRatio,
    /// Most loads per second first.
    Loads,
    /// Most stores per second first.
    Stores,
}

/// The order of the pools page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSort {
    Name,
    /// Fullest (allocated and reserved over capacity) first.
    Used,
    /// Largest first.
    Capacity,
}

impl NodeSort {
    /// The name shown in the header.
    pub fn name(self) -> &'static str {
        match self {
            NodeSort::Name => "name",
            NodeSort::HitRatio => "hit ratio",
            NodeSort::Loads => "loads/s",
            NodeSort::Stores => "stores/s",
        }
    }

    fn next(self) -> NodeSort {
        match self {
            NodeSort::Name => NodeSort::HitRatio,
            NodeSort::HitRatio => NodeSort::Loads,
            NodeSort::Loads => NodeSort::Stores,
            NodeSort::Stores => NodeSort::Name,
        }
    }
}

impl PoolSort {
    /// The name shown in the header.
    pub fn name(self) -> &'static str {
        match self {
            PoolSort::Name => "name",
            PoolSort::Used => "used",
            PoolSort::Capacity => "capacity",
        }
    }

    fn next(self) -> PoolSort {
        match self {
            PoolSort::Name => PoolSort::Used,
            PoolSort::Used => PoolSort::Capacity,
            PoolSort::Capacity => PoolSort::Name,
        }
    }
}

/// A key press, as far as `kvtier top` cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Tab,
    Escape,
    /// Ctrl-C (raw mode delivers it as a key, not as SIGINT).
    Interrupt,
    Other,
}

/// What a key asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The view changed: draw again.
    Redraw,
    Quit,
    Nothing,
}

/// The view's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViewState {
    pub page: Page,
    pub node_sort: NodeSort,
    pub pool_sort: PoolSort,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            page: Page::Nodes,
            node_sort: NodeSort::Name,
            pool_sort: PoolSort::Name,
        }
    }
}

impl ViewState {
    /// Applies a key: `q`, Escape and Ctrl-C quit; Tab switches between the nodes and pools
    /// pages, `n` and `p` go to one; `s` cycles the page's sort order.
    pub fn handle(&mut self, key: Key) -> Action {
        match key {
            Key::Char('q') | Key::Escape | Key::Interrupt => return Action::Quit,
            Key::Tab => {
                self.page = match self.page {
                    Page::Nodes => Page::Pools,
                    Page::Pools => Page::Nodes,
                }
            }
            Key::Char('n') => self.page = Page::Nodes,
            Key::Char('p') => self.page = Page::Pools,
            Key::Char('s') => match self.page {
                Page::Nodes => self.node_sort = self.node_sort.next(),
                Page::Pools => self.pool_sort = self.pool_sort.next(),
            },
            Key::Char(_) | Key::Other => return Action::Nothing,
        }
        Action::Redraw
    }

    /// The sort order's name for the current page.
    pub fn sort_name(&self) -> &'static str {
        match self.page {
            Page::Nodes => self.node_sort.name(),
            Page::Pools => self.pool_sort.name(),
        }
    }

    /// Orders node rows by the nodes page's sort (ties by name).
    pub fn sort_nodes(&self, rows: &mut [NodeRow]) {
        let key = |row: &NodeRow| match self.node_sort {
            NodeSort::Name => 0.0,
            NodeSort::HitRatio => -row.rates.hit_ratio_total.unwrap_or(-1.0),
            NodeSort::Loads => -row.rates.loads_per_second,
            NodeSort::Stores => -row.rates.stores_per_second,
        };
        rows.sort_by(|left, right| {
            key(left)
                .total_cmp(&key(right))
                .then_with(|| left.name.cmp(&right.name))
        });
    }

    /// Orders pool rows by the pools page's sort (ties by name).
    pub fn sort_pools(&self, rows: &mut [PoolRow]) {
        let key = |row: &PoolRow| match self.pool_sort {
            PoolSort::Name => 0.0,
            PoolSort::Used => -used_fraction(row),
            PoolSort::Capacity => -(row.usage.capacity_bytes as f64),
        };
        rows.sort_by(|left, right| {
            key(left)
                .total_cmp(&key(right))
                .then_with(|| left.name.cmp(&right.name))
        });
    }
}

/// Reserved and allocated bytes over capacity (zero for an empty pool).
pub fn used_fraction(row: &PoolRow) -> f64 {
    if row.usage.capacity_bytes == 0 {
        return 0.0;
    }
    (row.usage.reserved_bytes + row.usage.allocated_bytes) as f64 / row.usage.capacity_bytes as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::model::Rates;

    fn node(name: &str, hit_ratio: f64, loads_per_second: f64) -> NodeRow {
        NodeRow {
            name: name.into(),
            node: 0,
            epoch: 1,
            state: "live".into(),
            rates: Rates {
                hit_ratio_total: Some(hit_ratio),
                loads_per_second,
                ..Rates::default()
            },
            metrics_error: None,
        }
    }

    #[test]
    fn keys_switch_pages_cycle_sorts_and_quit() {
        let mut state = ViewState::default();
        assert_eq!(state.handle(Key::Tab), Action::Redraw);
        assert_eq!(state.page, Page::Pools);
        assert_eq!(state.handle(Key::Char('s')), Action::Redraw);
        assert_eq!(state.pool_sort, PoolSort::Used);
        assert_eq!(state.node_sort, NodeSort::Name);
        assert_eq!(state.handle(Key::Char('n')), Action::Redraw);
        assert_eq!(state.page, Page::Nodes);
        state.handle(Key::Char('s'));
        assert_eq!(state.sort_name(), "hit ratio");
        assert_eq!(state.handle(Key::Char('x')), Action::Nothing);
        for quit in [Key::Char('q'), Key::Escape, Key::Interrupt] {
            assert_eq!(state.handle(quit), Action::Quit);
        }
    }

    #[test]
    fn nodes_sort_by_the_chosen_figure_then_name() {
        let mut rows = vec![
            node("c", 0.5, 1.0),
            node("a", 0.9, 3.0),
            node("b", 0.9, 9.0),
        ];
        let mut state = ViewState::default();
        state.sort_nodes(&mut rows);
        let names = |rows: &[NodeRow]| rows.iter().map(|row| row.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&rows), ["a", "b", "c"]);
        state.node_sort = NodeSort::HitRatio;
        state.sort_nodes(&mut rows);
        assert_eq!(names(&rows), ["a", "b", "c"]);
        state.node_sort = NodeSort::Loads;
        state.sort_nodes(&mut rows);
        assert_eq!(names(&rows), ["b", "a", "c"]);
    }
}
