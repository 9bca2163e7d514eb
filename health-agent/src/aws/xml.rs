//! A reader for the XML the Query protocol answers with: elements, their text and their
//! children, nothing more (no attributes, namespaces, DTDs or CDATA, which AWS's answers do not
//! use for data). Enough to walk `DescribeAutoScalingGroupsResult/AutoScalingGroups/member` by
//! name, so a field is read where it belongs and not from a nested element that has the same
//! name (EC2 repeats `privateIpAddress` inside each network interface).

/// An element: its local name (any `prefix:` dropped), its text (the concatenated character
/// data directly inside it, entities decoded, trimmed) and its child elements in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Element {
    pub name: String,
    pub text: String,
    pub children: Vec<Element>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XmlError {
    #[error("not XML: {0}")]
    Malformed(&'static str),
    #[error("not XML: </{found}> closes <{open}>")]
    Mismatch { open: String, found: String },
    #[error("XML nested deeper than {MAX_DEPTH} elements")]
    TooDeep,
}

const MAX_DEPTH: usize = 64;

impl Element {
    /// The first child named `name`.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child named `name`.
    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The element at `path` below this one, each step the first child of that name.
    pub fn at(&self, path: &[&str]) -> Option<&Element> {
        path.iter().try_fold(self, |e, name| e.child(name))
    }

    /// The text of the child named `name`, if there is one.
    pub fn text_of(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }
}

/// The document's root element.
pub fn parse(doc: &str) -> Result<Element, XmlError> {
    let mut stack: Vec<Element> = Vec::new();
    let mut root = None;
    let mut rest = doc;
    while !rest.is_empty() {
        let Some(lt) = rest.find('<') else {
            text(&mut stack, rest);
            break;
        };
        text(&mut stack, &rest[..lt]);
        rest = &rest[lt..];
        // Declarations, comments, processing instructions: skipped whole.
        for (open, close) in [("<?", "?>"), ("<!--", "-->"), ("<!", ">")] {
            if rest.starts_with(open) {
                let end = rest
                    .find(close)
                    .ok_or(XmlError::Malformed("unclosed declaration or comment"))?;
                rest = &rest[end + close.len()..];
                break;
            }
        }
        if !rest.starts_with('<') {
            continue;
        }
        let gt = rest.find('>').ok_or(XmlError::Malformed("unclosed tag"))?;
        let tag = &rest[1..gt];
        rest = &rest[gt + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let name = local(name.trim());
            let done = stack
                .pop()
                .ok_or(XmlError::Malformed("a closing tag with nothing open"))?;
            if done.name != name {
                return Err(XmlError::Mismatch {
                    open: done.name,
                    found: name.into(),
                });
            }
            close(&mut stack, &mut root, done)?;
            continue;
        }
        let empty = tag.ends_with('/');
        let name = tag.trim_end_matches('/');
        let name = local(name.split_whitespace().next().unwrap_or(""));
        if name.is_empty() {
            return Err(XmlError::Malformed("a tag without a name"));
        }
        if stack.len() >= MAX_DEPTH {
            return Err(XmlError::TooDeep);
        }
        let e = Element {
            name: name.into(),
            ..Element::default()
        };
        if empty {
            close(&mut stack, &mut root, e)?;
        } else {
            stack.push(e);
        }
    }
    if !stack.is_empty() {
        return Err(XmlError::Malformed("an element is not closed"));
    }
    root.ok_or(XmlError::Malformed("no element"))
}

fn local(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

fn text(stack: &mut [Element], raw: &str) {
    if let Some(open) = stack.last_mut() {
        let t = decode(raw);
        let t = t.trim();
        if !t.is_empty() {
            open.text.push_str(t);
        }
    }
}

fn close(stack: &mut [Element], root: &mut Option<Element>, e: Element) -> Result<(), XmlError> {
    match stack.last_mut() {
        Some(parent) => parent.children.push(e),
        None if root.is_none() => *root = Some(e),
        None => return Err(XmlError::Malformed("more than one root element")),
    }
    Ok(())
}

/// The five named entities and numeric character references; anything else is kept as written.
fn decode(raw: &str) -> String {
    if !raw.contains('&') {
        return raw.to_string();
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let decoded = rest.find(';').and_then(|semi| {
            let c = match &rest[1..semi] {
                "lt" => '<',
                "gt" => '>',
                "amp" => '&',
                "quot" => '"',
                "apos" => '\'',
                n => {
                    let code = match n.strip_prefix("#x").or_else(|| n.strip_prefix("#X")) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => n.strip_prefix('#')?.parse().ok()?,
                    };
                    char::from_u32(code)?
                }
            };
            Some((c, semi + 1))
        });
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &rest[len..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_names_are_read_where_they_belong() {
        let doc = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <!-- a comment -->
  <reservationSet><item><instancesSet><item>
    <instanceId>i-1</instanceId>
    <networkInterfaceSet><item><privateIpAddress>10.9.9.9</privateIpAddress></item></networkInterfaceSet>
    <privateIpAddress>10.0.0.1</privateIpAddress>
    <tagSet/>
    <ec2:note>a &amp; b &lt;c&gt; &#65;&#x42; &bogus;</ec2:note>
  </item></instancesSet></item></reservationSet>
</DescribeInstancesResponse>"#;
        let root = parse(doc).unwrap();
        assert_eq!(root.name, "DescribeInstancesResponse");
        let i = root
            .at(&["reservationSet", "item", "instancesSet", "item"])
            .unwrap();
        assert_eq!(i.text_of("instanceId"), Some("i-1"));
        assert_eq!(i.text_of("privateIpAddress"), Some("10.0.0.1"));
        assert_eq!(i.text_of("tagSet"), Some(""));
        assert_eq!(i.text_of("note"), Some("a & b <c> AB &bogus;"));
        assert_eq!(i.children("privateIpAddress").count(), 1);
    }

    #[test]
    fn broken_documents_are_errors_not_panics() {
        for doc in [
            "",
            "just text",
            "<a>",
            "<a></b>",
            "</a>",
            "<a><b></a>",
            "<a/><b/>",
            "<a",
            "<!-- x",
            "<>",
        ] {
            assert!(parse(doc).is_err(), "{doc:?}");
        }
        let deep = "<a>".repeat(100) + &"</a>".repeat(100);
        assert_eq!(parse(&deep), Err(XmlError::TooDeep));
        // Multi-byte text around the markup.
        assert_eq!(parse("<a>é<b>ü</b></a>").unwrap().text, "é");
    }
}
