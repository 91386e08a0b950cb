//! Column chunks assembled from pages encoded one series at a time: the rollup tiers
//! (`crate::rollup`) keep one page per (object, column), fed one value per interval as the
//! intervals close (memory is the encoded bytes, not rows), and write a column's chunk as its
//! objects' pages in order. The encoding is the counter encoder's own (`ColumnState`: DELTA
//! blocks, LZ4 only where it pays, DATA_PAGE_V2), so the pages are what any reader already
//! reads in the raw files.

use super::{Chunk, ColumnState, EncodeOptions};
use crate::parquet::CounterEncoding;
use ::parquet::{
    basic::Compression, column::writer::ColumnCloseResult, errors::Result,
    schema::types::ColumnDescPtr,
};

/// One series' page, encoded as its values arrive.
pub(crate) struct SeriesPage(ColumnState);

impl std::fmt::Debug for SeriesPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeriesPage")
            .field("rows", &self.0.page_rows)
            .finish()
    }
}

impl SeriesPage {
    /// An empty DELTA_BINARY_PACKED page of an INT64 column (`unsigned`: UINT64, else a signed
    /// type such as a timestamp, which decides the chunk's min/max; `nullable`: the column is
    /// OPTIONAL).
    pub(crate) fn new(unsigned: bool, nullable: bool) -> Self {
        Self(ColumnState::new(
            CounterEncoding::DeltaBinaryPacked,
            unsigned,
            nullable,
        ))
    }

    /// Appends one row: a value or a null (a null in a required column is written as 0; the
    /// caller never passes one).
    pub(crate) fn push(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.0.push(&[v], None),
            None if self.0.nullable => self.0.push(&[0], Some(&[false])),
            None => self.0.push(&[0], None),
        }
    }

    /// Bytes held (encoded blocks, validity, the open block).
    pub(crate) fn memory(&self) -> usize {
        self.0.memory() + std::mem::size_of::<ColumnState>()
    }
}

/// A column chunk made of whole [`SeriesPage`]s, in the order they are appended.
pub(crate) struct PagedChunk {
    state: ColumnState,
    opts: EncodeOptions,
}

impl std::fmt::Debug for PagedChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedChunk")
            .field("pages", &self.state.chunk_pages)
            .finish()
    }
}

impl PagedChunk {
    /// An empty chunk (of pages made with the same `unsigned`/`nullable`) whose pages are
    /// compressed as `opts` says.
    pub(crate) fn new(unsigned: bool, nullable: bool, opts: EncodeOptions) -> Self {
        Self {
            state: ColumnState::new(CounterEncoding::DeltaBinaryPacked, unsigned, nullable),
            opts,
        }
    }

    /// Ends `page` and appends it as the chunk's next page (an empty page adds nothing).
    ///
    /// # Errors
    /// Compression failed.
    pub(crate) fn append(&mut self, mut page: SeriesPage) -> Result<()> {
        let p = &mut page.0;
        if p.page_rows == 0 {
            return Ok(());
        }
        p.finish_page(&self.opts)?;
        let pages = std::mem::take(&mut p.chunk);
        let s = &mut self.state;
        if s.chunk_pages == 0 {
            s.first_page_offset = s.chunk.len() as u64 + p.first_page_offset;
        }
        s.chunk.append(pages);
        s.chunk_pages += p.chunk_pages;
        s.chunk_compressed += p.chunk_compressed;
        s.chunk_uncompressed += p.chunk_uncompressed;
        s.chunk_rows += p.chunk_rows;
        s.chunk_nulls += p.chunk_nulls;
        if p.any {
            if s.any {
                if s.unsigned {
                    s.min = s.min.min(p.min);
                    s.max = s.max.max(p.max);
                } else {
                    s.min = (s.min as i64).min(p.min as i64) as u64;
                    s.max = (s.max as i64).max(p.max as i64) as u64;
                }
            } else {
                (s.min, s.max, s.any) = (p.min, p.max, true);
            }
        }
        Ok(())
    }

    /// The chunk's bytes and what `SerializedRowGroupWriter::append_column` needs.
    ///
    /// # Errors
    /// The metadata could not be built.
    pub(crate) fn finish(
        mut self,
        descr: &ColumnDescPtr,
        compression: Compression,
    ) -> Result<(Chunk, ColumnCloseResult)> {
        self.state.take_chunk(descr, compression)
    }
}
