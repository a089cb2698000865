//! `--refuse FIELD=VALUE[:STATUS]`: items the key may not touch. Real APIs
//! refuse one record and serve the next: a resource of another project
//! (403), an add-on the plan lacks (402), a token scoped away from it
//! (401). The refusal comes before admission: nothing runs, nothing is
//! charged.

use serde_json::Value;

/// One `--refuse` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field of the request's data (query or JSON body) it looks at.
    pub field: String,
    /// The value that field must have (compared as text).
    pub value: String,
    /// 401, 402 or 403.
    pub status: u16,
}

impl Refusal {
    /// What the sim says with the refusal.
    pub fn message(&self) -> &'static str {
        match self.status {
            401 => "this key is not valid for this resource",
            402 => "this item needs an add-on your plan does not include",
            _ => "this key may not access this resource",
        }
    }
}

/// Parses `FIELD=VALUE[:STATUS]` (STATUS 401, 402 or 403; default 403).
pub fn parse(s: &str) -> Result<Refusal, String> {
    let (field, rest) = s
        .split_once('=')
        .ok_or("expected FIELD=VALUE[:STATUS], e.g. n=7 or n=7:402")?;
    if field.is_empty() {
        return Err("the field before '=' is empty".into());
    }
    let (value, status) = match rest.rsplit_once(':') {
        Some((v, st)) => match st.trim().parse::<u16>() {
            Ok(code @ 401..=403) => (v, code),
            _ => return Err(format!("{st:?} is not 401, 402 or 403")),
        },
        None => (rest, 403),
    };
    Ok(Refusal {
        field: field.to_string(),
        value: value.to_string(),
        status,
    })
}

/// The first rule `data` falls under, if any.
pub fn find<'a>(rules: &'a [Refusal], data: &Value) -> Option<&'a Refusal> {
    rules.iter().find(|r| match data.get(&r.field) {
        Some(Value::String(s)) => *s == r.value,
        // A number or a boolean in a JSON body: the rule's text as JSON.
        Some(v) => serde_json::from_str::<Value>(&r.value).is_ok_and(|want| want == *v),
        None => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_parse_and_match_query_and_body_values() {
        let r = parse("n=7").unwrap();
        assert_eq!(r.status, 403);
        let p = parse("sku=a:b:402").unwrap();
        assert_eq!((p.value.as_str(), p.status), ("a:b", 402));
        assert!(parse("n=7:500").is_err());
        assert!(parse("=7").is_err());
        assert!(parse("n").is_err());
        let rules = [r, p];
        assert_eq!(find(&rules, &json!({"n": "7"})).unwrap().status, 403);
        assert_eq!(find(&rules, &json!({"n": 7})).unwrap().status, 403);
        assert_eq!(find(&rules, &json!({"sku": "a:b"})).unwrap().status, 402);
        assert!(find(&rules, &json!({"n": 8})).is_none());
        assert!(find(&rules, &json!({})).is_none());
    }
}
