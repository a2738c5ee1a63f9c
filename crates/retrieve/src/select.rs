//! Chunks of a rendered trace and the top-k most similar to a query.

/// Consecutive `lines` grouped into chunks of at most `max_chars` characters, joined by
/// newlines; a longer line is split into pieces of `max_chars`, so no text is lost. Empty
/// input, no chunks.
pub fn chunk_lines(lines: &[String], max_chars: usize) -> Vec<String> {
    let max_chars = max_chars.max(1);
    let pieces = lines.iter().flat_map(|line| {
        let chars: Vec<char> = line.chars().collect();
        if chars.is_empty() {
            vec![String::new()]
        } else {
            chars
                .chunks(max_chars)
                .map(|c| c.iter().collect::<String>())
                .collect()
        }
    });
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut current_chars = 0;
    for line in pieces {
        let n = line.chars().count();
        if current_chars > 0 && current_chars + 1 + n > max_chars {
            chunks.push(std::mem::take(&mut current));
            current_chars = 0;
        }
        if current_chars > 0 {
            current.push('\n');
            current_chars += 1;
        }
        current.push_str(&line);
        current_chars += n;
    }
    if current_chars > 0 {
        chunks.push(current);
    }
    chunks
}

/// Indices of the (at most) `k` `candidates` with the largest dot product with `query`, best
/// first; ties go to the earlier candidate. With unit vectors the dot product is the cosine.
pub fn top_k(query: &[f32], candidates: &[Vec<f32>], k: usize) -> Vec<usize> {
    let mut scored: Vec<(usize, f32)> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (i, c.iter().zip(query).map(|(a, b)| a * b).sum()))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.into_iter().take(k).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_group_into_chunks_under_the_limit() {
        let lines: Vec<String> = ["aaaa", "bb", "cccccccccc", "d"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            chunk_lines(&lines, 8),
            vec!["aaaa\nbb", "cccccccc", "cc\nd"]
        );
        assert!(chunk_lines(&[], 8).is_empty());
    }

    #[test]
    fn top_k_ranks_by_similarity_and_breaks_ties_by_order() {
        let c = vec![
            vec![0.0, 1.0],
            vec![1.0, 0.0],
            vec![0.6, 0.8],
            vec![1.0, 0.0],
        ];
        assert_eq!(top_k(&[1.0, 0.0], &c, 3), vec![1, 3, 2]);
        assert_eq!(top_k(&[0.0, 1.0], &c, 1), vec![0]);
        assert_eq!(top_k(&[0.0, 1.0], &c, 10).len(), 4);
    }
}
