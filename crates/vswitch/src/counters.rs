//! The [`counters!`](crate::counters!) macro: a struct of `u64` event counters whose every
//! field carries its dotted metric name once.
//!
//! A metric's name is part of Spillway's interface: the Prometheus endpoint, `ctl` output, the
//! simulator's JSON and the tests all spell it. When the struct field and the name were written
//! apart (the field in the struct, the name in a hand-written `iter()`), the two lists could
//! drift: a field added without its name, or names in another order than the fields. Writing
//! the name beside the field, and generating `iter()` from that one list, rules both out.
//!
//! Counters whose `iter()` is not a plain list of fields (one counter per variant of an enum,
//! such as [`crate::DropCounters`]) keep their own `iter()`: their names are already written
//! once, in the enum's `metric()`.

/// Declares a counters struct and its `iter()`.
///
/// Each field is written `name => "dotted.metric.name",` after its doc comment. The macro
/// generates the struct with one `pub` field of type `u64` per entry, deriving `Clone`,
/// `Debug` and `Default` (further derives and attributes go on the struct as usual), puts the
/// metric name at the head of each field's documentation, and generates
/// `iter(&self) -> impl Iterator<Item = (&'static str, u64)>` yielding `(name, value)` in
/// declaration order.
///
/// ```
/// spillway_vswitch::counters! {
///     /// What the example counted.
///     #[derive(Copy, PartialEq, Eq)]
///     pub struct ExampleCounters {
///         /// Frames seen.
///         seen => "example.seen",
///         /// Frames dropped.
///         dropped => "example.drop",
///     }
/// }
///
/// let c = ExampleCounters { seen: 3, dropped: 1 };
/// let pairs: Vec<_> = c.iter().collect();
/// assert_eq!(pairs, [("example.seen", 3), ("example.drop", 1)]);
/// ```
///
/// A struct whose public `iter()` must yield more than its own fields (another struct's
/// counters after its own) names the generated method otherwise with a leading `iter = NAME;`
/// and writes its `iter()` by hand from that method, so each name is still written once:
///
/// ```
/// spillway_vswitch::counters! {
///     /// The extra counters.
///     pub struct Extra {
///         /// Frames retried.
///         retried => "example.retried",
///     }
/// }
/// spillway_vswitch::counters! {
///     iter = iter_own;
///     /// The example's own counters; `iter` adds [`Extra`]'s.
///     pub struct Main {
///         /// Frames seen.
///         seen => "example.seen",
///     }
/// }
///
/// impl Main {
///     /// Ours, then the extra counters.
///     pub fn iter<'a>(&'a self, extra: &'a Extra) -> impl Iterator<Item = (&'static str, u64)> + 'a {
///         self.iter_own().chain(extra.iter())
///     }
/// }
///
/// let (m, e) = (Main { seen: 2 }, Extra { retried: 1 });
/// let pairs: Vec<_> = m.iter(&e).collect();
/// assert_eq!(pairs, [("example.seen", 2), ("example.retried", 1)]);
/// ```
#[macro_export]
macro_rules! counters {
    (
        iter = $iter:ident;
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field:ident => $metric:literal
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default)]
        $vis struct $name {
            $(
                #[doc = concat!("`", $metric, "`:")]
                $(#[$field_meta])*
                pub $field: u64,
            )+
        }

        impl $name {
            /// Every counter as `(dotted metric name, value)`, in declaration order.
            pub fn $iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$(($metric, self.$field)),+].into_iter()
            }

            /// Adds every counter of `other` to this one's (totals over several shards).
            #[allow(dead_code, reason = "generated for every counter set; not all are summed")]
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)+
            }
        }
    };
    // Without `iter = NAME;` the generated method is `iter`.
    ($($body:tt)+) => {
        $crate::counters! { iter = iter; $($body)+ }
    };
}

#[cfg(test)]
mod tests {
    crate::counters! {
        /// Counters for the test, with an extra derive and a private struct.
        #[derive(PartialEq, Eq)]
        struct Probe {
            /// The first.
            first => "probe.first",
            /// The second, whose name does not follow its field's.
            second => "probe.other.name",
            /// The third, declared without a trailing comma.
            third => "probe.third"
        }
    }

    #[test]
    fn iter_yields_every_field_with_its_name_in_declaration_order() {
        let c = Probe {
            first: 1,
            second: 2,
            third: u64::MAX,
        };
        let pairs: Vec<(&str, u64)> = c.iter().collect();
        assert_eq!(
            pairs,
            [
                ("probe.first", 1),
                ("probe.other.name", 2),
                ("probe.third", u64::MAX)
            ]
        );
    }

    #[test]
    fn the_struct_has_the_generated_and_the_declared_derives() {
        let c = Probe::default();
        assert_eq!(c.iter().map(|(_, v)| v).sum::<u64>(), 0);
        let mut d = c.clone();
        d.second += 1;
        assert_ne!(c, d);
        assert!(format!("{d:?}").contains("second: 1"));
    }
}
