package kvmem

import "fmt"

// checkSlab checks that slab (an L2 slab of pagesPerSlab pages in layout lay) holds page.
func (s *Shape) checkSlab(lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	if page < 0 || page >= pagesPerSlab {
		return &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L2 page %d outside a slab of %d pages", page, pagesPerSlab)}
	}
	need := int64(pagesPerSlab) * s.PageBytes()
	if lay == PageFirst {
		need = int64(page+1) * s.PageBytes()
	} else if lay != LayerFirst {
		return &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L2 layout %s is neither page_first nor layer_first", lay)}
	}
	if int64(len(slab)) < need {
		return &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L2 slab of %d bytes, page %d of %d pages of %d bytes (%s) needs %d", len(slab), page, pagesPerSlab, s.PageBytes(), lay, need)}
	}
	return nil
}

// Gather copies slot's page from a host L1 into page `page` of an L2 slab of pagesPerSlab
// pages in layout lay (a backup): chunk by chunk in layer order, one copy per chunk when the
// chunk is contiguous. With PageFirst, slab may be the page alone (pagesPerSlab 1, page 0).
func (l *L1) Gather(slot int32, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	return l.copyLayers(true, slot, 0, l.shape.Layers(), lay, slab, pagesPerSlab, page)
}

// Scatter copies page `page` of an L2 slab into slot of a host L1 (a load), as Gather.
func (l *L1) Scatter(slot int32, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	return l.copyLayers(false, slot, 0, l.shape.Layers(), lay, slab, pagesPerSlab, page)
}

// GatherLayer is Gather of one layer.
func (l *L1) GatherLayer(slot int32, layer int, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	return l.copyLayers(true, slot, layer, layer+1, lay, slab, pagesPerSlab, page)
}

// ScatterLayer is Scatter of one layer: a layered load copies layer 0 of every page first.
func (l *L1) ScatterLayer(slot int32, layer int, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	return l.copyLayers(false, slot, layer, layer+1, lay, slab, pagesPerSlab, page)
}

func (l *L1) copyLayers(toL2 bool, slot int32, from, to int, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	s := l.shape
	if l.device {
		return &Error{Layer: -1, Part: -1, Reason: "host gather/scatter of a device L1"}
	}
	if from < 0 || to > s.Layers() {
		return s.checkChunk(from, 0)
	}
	if slot < 0 || int(slot) >= l.slots {
		return &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("L1 slot %d out of [0, %d)", slot, l.slots)}
	}
	if err := s.checkSlab(lay, slab, pagesPerSlab, page); err != nil {
		return err
	}
	np := s.Parts()
	for layer := from; layer < to; layer++ {
		for j := range np {
			b := &l.bufs[layer*np+j]
			off := int64(slot) * b.PageStride
			var l2 int64
			if lay == PageFirst {
				l2 = int64(page)*s.PageBytes() + int64(layer)*s.layerBytes + s.partOff[j]
			} else {
				l2 = (int64(layer)*int64(pagesPerSlab)+int64(page))*s.layerBytes + s.partOff[j]
			}
			n := int64(s.bpt[j]) * int64(s.pageTokens)
			c := slab[l2 : l2+n]
			if b.TokenStride == int64(s.bpt[j]) {
				if toL2 {
					copy(c, b.Host[off:off+n])
				} else {
					copy(b.Host[off:off+n], c)
				}
				continue
			}
			bpt := int64(s.bpt[j])
			for k := int64(0); k < int64(s.pageTokens); k++ {
				t := b.Host[off+k*b.TokenStride : off+k*b.TokenStride+bpt]
				if toL2 {
					copy(c[k*bpt:], t)
				} else {
					copy(t, c[k*bpt:(k+1)*bpt])
				}
			}
		}
	}
	return nil
}

// ReadPageFirst copies page `page` of an L2 slab in layout lay into dst (PageBytes long) in
// page-first order: the page's L3 value whatever the L2 layout.
func (s *Shape) ReadPageFirst(dst []byte, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	return s.pageFirst(false, dst, lay, slab, pagesPerSlab, page)
}

// WritePageFirst copies src, a page's page-first bytes (an L3 value), into page `page` of an
// L2 slab in layout lay.
func (s *Shape) WritePageFirst(src []byte, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	return s.pageFirst(true, src, lay, slab, pagesPerSlab, page)
}

func (s *Shape) pageFirst(toSlab bool, pf []byte, lay L2Layout, slab []byte, pagesPerSlab, page int) error {
	if int64(len(pf)) != s.PageBytes() {
		return &Error{Layer: -1, Part: -1, Reason: fmt.Sprintf("page-first buffer of %d bytes, a page has %d", len(pf), s.PageBytes())}
	}
	if err := s.checkSlab(lay, slab, pagesPerSlab, page); err != nil {
		return err
	}
	for layer := range s.Layers() {
		var at int64
		if lay == PageFirst {
			at = int64(page)*s.PageBytes() + int64(layer)*s.layerBytes
		} else {
			at = (int64(layer)*int64(pagesPerSlab) + int64(page)) * s.layerBytes
		}
		l2 := slab[at : at+s.layerBytes]
		p := pf[int64(layer)*s.layerBytes : int64(layer+1)*s.layerBytes]
		if toSlab {
			copy(l2, p)
		} else {
			copy(p, l2)
		}
	}
	return nil
}
