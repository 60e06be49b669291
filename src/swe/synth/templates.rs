//! The module templates synthetic projects are assembled from (Python sources under `assets/swe/synth`).
//!
//! Test files import the package as `PKG`; modules import each other relatively.

/// One module template with its unittest file.
#[derive(Debug, Clone, Copy)]
pub struct Template {
    /// Canonical module name.
    pub name: &'static str,
    /// Names the module may be given (first = canonical); only names that never clash with identifiers.
    pub aliases: &'static [&'static str],
    /// Templates this one imports.
    pub deps: &'static [&'static str],
    /// Module source.
    pub module: &'static str,
    /// Test source (`from PKG import name`).
    pub tests: &'static str,
}

macro_rules! template {
    ($name:literal, [$($alias:literal),*], [$($dep:literal),*]) => {
        Template {
            name: $name,
            aliases: &[$name, $($alias),*],
            deps: &[$($dep),*],
            module: include_str!(concat!("../../../assets/swe/synth/", $name, ".py")),
            tests: include_str!(concat!("../../../assets/swe/synth/test_", $name, ".py")),
        }
    };
}

/// All templates.
pub const TEMPLATES: [Template; 13] = [
    template!("cache", ["lru"], []),
    template!("config", [], []),
    template!("geometry", ["shapes"], []),
    template!("grades", ["grading"], ["mathutils", "stats"]),
    template!("graph", [], []),
    template!("inventory", ["stock"], ["mathutils"]),
    template!("mathutils", ["numeric", "mathx"], []),
    template!("money", ["pricing"], ["mathutils"]),
    template!("report", ["reporting"], ["stats", "text"]),
    template!("scheduler", [], []),
    template!("stats", ["descriptive"], ["mathutils"]),
    template!("text", [], []),
    template!("validators", ["checks"], []),
];

/// Looks a template up by canonical name.
pub fn by_name(name: &str) -> Option<&'static Template> {
    TEMPLATES.iter().find(|t| t.name == name)
}

/// Package names (a numeric suffix keeps repositories apart).
pub const PACKAGE_WORDS: [&str; 24] = [
    "tally", "ledgerly", "quill", "abacus", "pebble", "harbor", "lumen", "orchard", "sprocket",
    "tessel", "kestrel", "juniper", "marlin", "nimbus", "ostrich", "parcel", "quokka", "rivet",
    "sable", "thimble", "umber", "vesper", "wicket", "yarrow",
];
