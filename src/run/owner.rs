//! Who owns an output: `.NAME.owner` beside `--out` and `--failures` names
//! the job that wrote it last and its input, so that another job does not
//! replace a job's results unless told to.

use std::path::Path;

use anyhow::Context as _;

use crate::exit::RunError;
use crate::input::FieldOrder;
use crate::settings::{Settings, SIM_ORIGIN};
use crate::util::owner_path;

/// Who wrote an output last, as its owner record says.
pub(super) struct Owner {
    /// The job.
    pub(super) job: String,
    /// Its input.
    pub(super) input: String,
    /// Whether it was a rehearsal (`--sim`): the built-in sim's answers,
    /// which a real run of the same input replaces (false in records
    /// written before it was kept).
    pub(super) rehearsal: bool,
    /// How the job fingerprints its items: a job the checkpoint lost is
    /// remade with it, or its keys and shards would change (`Kept` in
    /// records written before it was kept, whose jobs all kept it).
    pub(super) field_order: FieldOrder,
    /// Whether its keys take a JSON body by its content (`keys_sorted_body`):
    /// a job the checkpoint lost is remade with it, or the keys of its calls
    /// of unknown outcome would change (false in records written before it
    /// was kept, whose jobs all keyed bodies as sent).
    pub(super) sorted_body: bool,
}

/// The job that wrote `p` last, if batchrun wrote it.
pub(super) fn owner_of(p: &Path) -> Option<Owner> {
    let text = std::fs::read_to_string(owner_path(p)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(Owner {
        job: v["job"].as_str()?.to_string(),
        input: v["input"].as_str()?.to_string(),
        rehearsal: v["rehearsal"] == true,
        field_order: match v["any_field_order"] == true {
            true => FieldOrder::Ignored,
            false => FieldOrder::Kept,
        },
        sorted_body: v["keys_sorted_body"] == true,
    })
}

/// The owner record of the job `id`, which the checkpoint does not know,
/// if its outputs' record names it or its input (a job made again after a
/// regenerated input took another id, and kept its keys).
fn lost_job(settings: &Settings, id: &str) -> Option<Owner> {
    let input = std::fs::canonicalize(&settings.input).ok();
    let ours = |o: &Owner| o.job == id || input.as_deref() == Some(Path::new(&o.input));
    [&settings.out, &settings.failures]
        .into_iter()
        .filter_map(|p| owner_of(p))
        .find(ours)
}

/// How the job `id`, which the checkpoint lost, fingerprinted its items.
pub(super) fn field_order_of(settings: &Settings, id: &str) -> Option<FieldOrder> {
    lost_job(settings, id).map(|o| o.field_order)
}

/// Whether the job `id`, which the checkpoint lost, keyed JSON bodies by
/// their content.
pub(super) fn sorted_body_of(settings: &Settings, id: &str) -> Option<bool> {
    lost_job(settings, id).map(|o| o.sorted_body)
}

/// Records that `o.job` (on `o.input`; a rehearsal's, on the built-in
/// sim) wrote `p`.
pub(super) fn write_owner(p: &Path, o: &Owner) -> anyhow::Result<()> {
    let path = owner_path(p);
    let tmp = path.with_extension(format!("owner.{}.tmp", std::process::id()));
    let text = serde_json::json!({
        "job": o.job,
        "input": o.input,
        "rehearsal": o.rehearsal,
        "any_field_order": o.field_order == FieldOrder::Ignored,
        "keys_sorted_body": o.sorted_body,
    });
    let text = text.to_string();
    std::fs::write(&tmp, text + "\n")
        .and_then(|()| std::fs::rename(&tmp, &path))
        .with_context(|| format!("writing {}", path.display()))
}

/// The outputs `old` wrote now belong to `new`, which took its results
/// over (a regenerated input). Best effort: a sidecar left naming `old`
/// only makes the next run ask for `--force-outputs`.
pub(super) fn hand_over(settings: &Settings, old: &str, new: &str) {
    for p in [&settings.out, &settings.failures] {
        if let Some(o) = owner_of(p) {
            if o.job == old {
                let o = Owner {
                    job: new.to_string(),
                    ..o
                };
                let _ = write_owner(p, &o);
            }
        }
    }
}

/// Outputs belong to the job that wrote them: another job may not replace
/// a non-empty one (it would lose that job's results) unless
/// `--force-outputs` says so, or it took that job over (`superseded`:
/// `--keep-done`, `--fresh`, or a job that finished nothing).
pub fn check_owners(settings: &Settings, job: &str, superseded: &[String]) -> Result<(), RunError> {
    if settings.force_outputs {
        return Ok(());
    }
    for p in [&settings.out, &settings.failures] {
        if std::fs::metadata(p).map_or(true, |m| m.len() == 0) {
            continue;
        }
        let Some(Owner {
            job: owner,
            input,
            rehearsal,
            ..
        }) = owner_of(p)
        else {
            // No owner record: batchrun's own outputs of an earlier version
            // (or whose record was lost) are replaced as before; any other
            // file is somebody's data.
            if reads_as_outputs(p) {
                continue;
            }
            return Err(RunError::Usage(format!(
                "{} exists and does not hold batchrun's outputs; this job would replace it. \
                 Nothing was sent. Name another --out or --failures, or use --force-outputs \
                 to replace it",
                p.display()
            )));
        };
        if owner == job || superseded.contains(&owner) {
            continue;
        }
        // A rehearsal's outputs are the sim's answers: the real run they
        // rehearsed replaces them (never the other way round).
        if settings.origin != SIM_ORIGIN && rehearsal {
            crate::report::err_line(&format!(
                "batchrun: {} held a rehearsal's results (job {owner}, on the built-in sim): \
                 this run replaces them",
                p.display()
            ));
            continue;
        }
        // A pipe's spooled copy is gone with its run: name what it was.
        let input = match crate::input::is_spooled_copy(Path::new(&input)) {
            true => "a piped input".to_string(),
            false => input,
        };
        return Err(RunError::Usage(format!(
            "{} holds the outputs of another job ({owner}, on {input}); this job ({job}) would \
             replace them. Nothing was sent. Give this job its own --out and --failures, or \
             use --force-outputs to replace them",
            p.display()
        )));
    }
    Ok(())
}

/// Whether `p` starts as batchrun writes its outputs: a JSON line whose
/// first field is `line`, or the CSV header `line,status`.
fn reads_as_outputs(p: &Path) -> bool {
    use std::io::Read as _;
    let mut head = Vec::new();
    // A short or failed read leaves less to compare: not ours.
    let _ = std::fs::File::open(p).and_then(|f| f.take(16).read_to_end(&mut head));
    head.starts_with(b"{\"line\":") || head.starts_with(b"line,status")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a job keyed its bodies survives in its outputs' owner record,
    /// and a record written before it was kept says "as sent": a job the
    /// checkpoint lost is remade with the keys its calls went under.
    #[test]
    fn the_owner_record_keeps_how_bodies_were_keyed() {
        let dir = std::env::temp_dir().join(format!("batchrun-owner-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("items.results.jsonl");
        let owner = |sorted_body| Owner {
            job: "j".into(),
            input: "/in/items.jsonl".into(),
            rehearsal: false,
            field_order: FieldOrder::Ignored,
            sorted_body,
        };
        for sorted in [true, false] {
            write_owner(&out, &owner(sorted)).unwrap();
            assert_eq!(owner_of(&out).map(|o| o.sorted_body), Some(sorted));
        }
        let older = r#"{"job":"j","input":"/in/items.jsonl","any_field_order":true}"#;
        std::fs::write(owner_path(&out), older).unwrap();
        assert_eq!(owner_of(&out).map(|o| o.sorted_body), Some(false));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
